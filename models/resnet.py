"""ResNet-18/34 with torchvision's exact structure (BasicBlock), seeded and BN-calibrated."""
from __future__ import annotations

import onnx

from ._builder import GraphBuilder

WIDTHS = (64, 128, 256, 512)
CALIBRATION_BATCH = 8


def _basic_block(gb: GraphBuilder, x, cin, cout, stride, prefix):
    """conv3x3-BN-ReLU, conv3x3-BN, + identity (or 1x1/stride conv-BN downsample), ReLU."""
    y = gb.conv_bn(x, cin, cout, 3, f"{prefix}.conv1", stride=stride, act="relu", bn_hint=f"{prefix}.bn1")
    y = gb.conv_bn(y, cout, cout, 3, f"{prefix}.conv2", bn_hint=f"{prefix}.bn2")
    if stride != 1 or cin != cout:
        x = gb.conv_bn(x, cin, cout, 1, f"{prefix}.downsample.0", stride=stride,
                       bn_hint=f"{prefix}.downsample.1")
    return gb.relu(gb.op("Add", [y, x], prefix), prefix)


def _resnet(name: str, depths, seed: int, classes: int = 1000) -> onnx.ModelProto:
    gb = GraphBuilder(name, seed)
    x = gb.input("input", ["N", 3, 224, 224])
    x = gb.conv_bn(x, 3, 64, 7, "conv1", stride=2, act="relu", bn_hint="bn1")
    x = gb.op("MaxPool", [x], "maxpool", ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
              pads=[1, 1, 1, 1], strides=[2, 2])
    cin = 64
    for stage, (width, depth) in enumerate(zip(WIDTHS, depths), start=1):
        for i in range(depth):
            stride = 2 if stage > 1 and i == 0 else 1
            x = _basic_block(gb, x, cin, width, stride, f"layer{stage}.{i}")
            cin = width
    gb.classifier_head(x, cin, classes)
    gb.output("output", ["N", classes])
    batch = gb.rng.standard_normal((CALIBRATION_BATCH, 3, 224, 224)).astype("float32")
    doc = (f"{name}: torchvision structure (BasicBlock {list(depths)}), He-initialised weights from "
           f"seed {seed}, BatchNorm statistics calibrated on a random batch; not trained.")
    return gb.model(doc, calibration_batch=batch)


def resnet18(seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnet18", (2, 2, 2, 2), seed)


def resnet34(seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnet34", (3, 4, 6, 3), seed)
