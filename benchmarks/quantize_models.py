"""Quantized models to check modelc against, made by onnxruntime's own quantizer.

    python benchmarks/quantize_models.py -o DIR [--models resnet18 mobilenet_v2 ...] [--from FILE.onnx ...]
    python benchmarks/check_models.py DIR --bench

Each float model (modelc's seeded examples, or ONNX files such as benchmarks/export_torchvision.py
writes) is pre-processed (shape inference, BatchNormalization folded: onnxruntime's
`quant_pre_process`) and quantized statically, uint8 activations and int8 weights, calibrated on
seeded random inputs, in both formats onnxruntime writes:
  NAME_qop.onnx  QOperator: QLinearConv, QLinearMatMul and onnxruntime's com.microsoft ops
                 (QLinearAdd, QLinearGlobalAveragePool, QGemm ...), as the ONNX zoo's int8 models;
  NAME_qdq.onnx  QDQ: float ops between DequantizeLinear and QuantizeLinear (per-channel weights),
                 onnxruntime's default format and what PyTorch exports.
Random weights and inputs: the numbers say how close modelc is to onnxruntime, not how accurate a
quantized network is.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
# (this directory's float16.py would shadow the module of that name onnxruntime's quantizer imports)
sys.path = [os.path.join(HERE, "..")] + [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
import models  # noqa: E402

DEFAULT = ["resnet18", "mobilenet_v2", "efficientnet_b0", "squeezenet1_1", "transformer"]


def _feeds(model: onnx.ModelProto, n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        feed = {}
        for i in model.graph.input:
            if i.name in {t.name for t in model.graph.initializer}:
                continue
            shape = [d.dim_value or 1 for d in i.type.tensor_type.shape.dim]
            dt = onnx.helper.tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type)
            feed[i.name] = (rng.integers(0, 100, shape) if dt.kind in "iu" else rng.standard_normal(shape)).astype(dt)
        out.append(feed)
    return out


def quantize(src: str, name: str, out_dir: str, calibration: int = 4) -> list[str]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load(src)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(_feeds(model, calibration))

        def get_next(self):
            return next(self.it, None)

    written = []
    with tempfile.TemporaryDirectory() as tmp:
        pre = os.path.join(tmp, "pre.onnx")
        quant_pre_process(src, pre)
        for fmt, per_channel in (("qop", False), ("qdq", True)):
            dst = os.path.join(out_dir, f"{name}_{fmt}.onnx")
            quantize_static(pre, dst, Reader(), quant_format=QuantFormat.QOperator if fmt == "qop" else QuantFormat.QDQ,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8, per_channel=per_channel)
            written.append(dst)
    return written


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--out", required=True, help="directory to write the quantized models to")
    p.add_argument("--models", nargs="*", default=None, help=f"modelc's example models (default {DEFAULT})")
    p.add_argument("--from", dest="files", nargs="*", default=[], help="float ONNX files to quantize too")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    names = args.models if args.models is not None else ([] if args.files else DEFAULT)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            src = os.path.join(tmp, f"{name}.onnx")
            onnx.save(models.build(name), src)
            for path in quantize(src, name, args.out):
                print(path)
    for f in args.files:
        for path in quantize(f, os.path.splitext(os.path.basename(f))[0], args.out):
            print(path)


if __name__ == "__main__":
    main()
