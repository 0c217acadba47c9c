"""The te kernels' entries in the template registry: their spaces are derived (sketch.py), not written.

Records of a user's te kernels are filed under the template name "te", so the measurer's workers,
the records' checks and ApplyHistoryBest find it like any template; it never matches an ONNX
workload. A fused ONNX group declared in te (groups.py) is "te_group" where no hand-written
template takes it (instead of the numpy fallback), and "te_conv2d", "te_depthwise", "te_conv" (beside
conv_generic), "te_dense" or "te_matmul" beside the template that does: a second algorithm, tuned as
a task of its own and chosen only by a faster record (as Winograd is).
"""
from __future__ import annotations

import functools
import json
import logging

from ..kernels.space import Config, ConfigSpace
from ..kernels.template import Kernel, Template, register
from . import sketch
from .codegen import kernel_source
from .groups import Unsupported, declare
from .workload import TeWorkload

logger = logging.getLogger(__name__)


@register
class TeTemplate(Template):
    name = "te"
    priority = 1000
    search = "evolutionary"       # the XGBoost tuner plans with Ansor's evolutionary search

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


@functools.lru_cache(maxsize=512)
def _declared(key: str):
    from ..kernels.workload import Workload
    try:
        return declare(Workload(json.loads(key)))
    except Unsupported:
        return None
    except Exception as e:      # a form the lowerings misjudge: the group keeps its template or the
        logger.warning("no te declaration for a %s group: %s: %s", "-".join(o["op"] for o in
                       json.loads(key)["ops"]), type(e).__name__, e)       # fallback, and it says so
        return None


def declared(wl):
    """The te declaration of an ONNX workload (groups.py), or None. Kept on the workload too: the
    tuner asks for it with every candidate it scores (features)."""
    if isinstance(wl, TeWorkload):
        return None
    if not hasattr(wl, "_te"):
        wl._te = _declared(json.dumps(wl.json, sort_keys=True))
    return wl._te


class _Group(Template):
    search = "evolutionary"
    def matches(self, wl) -> bool:
        return declared(wl) is not None

    def space(self, wl) -> ConfigSpace:
        return sketch.space(declared(wl).plan)

    def default_config(self, wl, space: ConfigSpace) -> Config:
        return space.from_values(sketch.default_values(declared(wl).plan, space))

    def features(self, wl, cfg: Config) -> dict:
        return sketch.loop_features(declared(wl).plan, dict(cfg.values))

    def build(self, wl, cfg: Config) -> Kernel:
        d = declared(wl)
        src, _ = kernel_source(d.plan, dict(cfg.values))
        packs = d.packs
        return Kernel(src, list(d.args), (lambda consts: {n: fn(consts) for n, fn in packs.items()}) if packs else None)


@register
class TeGroup(_Group):
    name = "te_group"
    priority = 99                 # after every hand-written template, before the numpy fallback


def _alternative(name: str, to: str):
    cls = type(f"Te_{to}", (_Group,), {"name": name, "alternative_to": to, "priority": 99})
    register(cls)
    return cls


for _name, _to in (("te_conv2d", "conv2d"), ("te_depthwise", "depthwise_conv2d"), ("te_conv", "conv_generic"),
                   ("te_dense", "dense"), ("te_matmul", "batch_matmul")):
    _alternative(_name, _to)
