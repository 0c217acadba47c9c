"""The te kernels' entry in the template registry: the space is derived (sketch.py), not written.

Records of te kernels are filed under the template name "te", so the measurer's workers, the
records' checks and ApplyHistoryBest find it like any template; it never matches an ONNX
workload (those go to the hand-written templates).
"""
from __future__ import annotations

from ..kernels.space import Config, ConfigSpace
from ..kernels.template import Kernel, Template, register
from . import sketch
from .codegen import kernel_source
from .workload import TeWorkload


@register
class TeTemplate(Template):
    name = "te"
    priority = 1000

    def matches(self, wl) -> bool:
        return isinstance(wl, TeWorkload)

    def space(self, wl: TeWorkload) -> ConfigSpace:
        return sketch.space(wl.plan)

    def default_config(self, wl: TeWorkload, space: ConfigSpace) -> Config:
        return space.from_values(sketch.default_values(wl.plan, space))

    def features(self, wl: TeWorkload, cfg: Config) -> dict:
        return sketch.loop_features(wl.plan, dict(cfg.values))

    def build(self, wl: TeWorkload, cfg: Config) -> Kernel:
        src, tensors = kernel_source(wl.plan, dict(cfg.values))
        return Kernel(src, ["out0", *(f"in{k}" for k in range(len(tensors) - 1))])
