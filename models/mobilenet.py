"""MobileNetV2 (width 1.0) with torchvision's structure, seeded and BN-calibrated."""
from __future__ import annotations

import onnx

from ._builder import GraphBuilder

# (expansion t, output channels c, repeats n, first stride s), as in the paper and torchvision
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
            (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
LAST_CHANNELS = 1280
CALIBRATION_BATCH = 8


def _inverted_residual(gb: GraphBuilder, x, cin, cout, stride, t, prefix):
    """[expand 1x1-BN-ReLU6] -> depthwise 3x3-BN-ReLU6 -> project 1x1-BN [+ x]."""
    hidden = cin * t
    y, i = x, 0
    if t != 1:
        y = gb.conv_bn(y, cin, hidden, 1, f"{prefix}.conv.0.0", act="relu6", bn_hint=f"{prefix}.conv.0.1")
        i = 1
    y = gb.conv_bn(y, hidden, hidden, 3, f"{prefix}.conv.{i}.0", stride=stride, groups=hidden,
                   act="relu6", bn_hint=f"{prefix}.conv.{i}.1")
    y = gb.conv_bn(y, hidden, cout, 1, f"{prefix}.conv.{i + 1}", bn_hint=f"{prefix}.conv.{i + 2}")
    if stride == 1 and cin == cout:
        y = gb.op("Add", [x, y], prefix)
    return y


def mobilenet_v2(seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    gb = GraphBuilder("mobilenet_v2", seed)
    x = gb.input("input", ["N", 3, 224, 224])
    x = gb.conv_bn(x, 3, 32, 3, "features.0.0", stride=2, act="relu6", bn_hint="features.0.1")
    cin, index = 32, 1
    for t, c, n, s in SETTINGS:
        for i in range(n):
            x = _inverted_residual(gb, x, cin, c, s if i == 0 else 1, t, f"features.{index}")
            cin, index = c, index + 1
    x = gb.conv_bn(x, cin, LAST_CHANNELS, 1, f"features.{index}.0", act="relu6",
                   bn_hint=f"features.{index}.1")
    gb.classifier_head(x, LAST_CHANNELS, classes, hint="classifier.1")
    gb.output("output", ["N", classes])
    batch = gb.rng.standard_normal((CALIBRATION_BATCH, 3, 224, 224)).astype("float32")
    doc = (f"mobilenet_v2: torchvision structure, He-initialised weights from seed {seed}, "
           f"BatchNorm statistics calibrated on a random batch; not trained.")
    return gb.model(doc, calibration_batch=batch)
