"""SqueezeNet 1.1 with torchvision's exact structure, seeded and calibrated.

SqueezeNet has no BatchNorm: each conv is built with one, calibrated like the other models, and the
BatchNorm is then folded into the conv's weight and bias, so every conv output starts normalised
and the exported graph is torchvision's (Conv with bias, ReLU, MaxPool, Concat).
"""
from __future__ import annotations

import onnx

from ._builder import GraphBuilder

# torchvision squeezenet1_1's features: "M" is MaxPool(3, 2, ceil_mode=True), a tuple is
# Fire(in, squeeze, expand1x1, expand3x3)
FEATURES = ("M", (64, 16, 64, 64), (128, 16, 64, 64), "M", (128, 32, 128, 128), (256, 32, 128, 128), "M",
            (256, 48, 192, 192), (384, 48, 192, 192), (384, 64, 256, 256), (512, 64, 256, 256))
STEM_CHANNELS = 64
CALIBRATION_BATCH = 8


def _conv_relu(gb: GraphBuilder, x, cin, cout, k, hint, stride=1, pad=None):
    """Conv (bias, after folding) + ReLU; the BatchNorm in between is folded away after calibration."""
    return gb.conv_bn(x, cin, cout, k, hint, stride=stride, act="relu", pad=pad)


def _fire(gb: GraphBuilder, x, cin, squeeze, e1, e3, prefix):
    """squeeze 1x1-ReLU, then expand 1x1-ReLU and expand 3x3-ReLU concatenated on channels."""
    s = _conv_relu(gb, x, cin, squeeze, 1, f"{prefix}.squeeze")
    a = _conv_relu(gb, s, squeeze, e1, 1, f"{prefix}.expand1x1")
    b = _conv_relu(gb, s, squeeze, e3, 3, f"{prefix}.expand3x3")
    return gb.op("Concat", [a, b], prefix, axis=1)


def squeezenet1_1(seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    gb = GraphBuilder("squeezenet1_1", seed)
    x = gb.input("input", ["N", 3, 224, 224])
    x = _conv_relu(gb, x, 3, STEM_CHANNELS, 3, "features.0", stride=2, pad=0)
    cin = STEM_CHANNELS
    for index, layer in enumerate(FEATURES, start=2):
        if layer == "M":
            x = gb.op("MaxPool", [x], f"features.{index}", ceil_mode=1, dilations=[1, 1], kernel_shape=[3, 3],
                      pads=[0, 0, 0, 0], strides=[2, 2])
            continue
        assert layer[0] == cin, layer
        x = _fire(gb, x, *layer, f"features.{index}")
        cin = layer[2] + layer[3]
    # classifier: Dropout (identity in eval), Conv 1x1, ReLU, AdaptiveAvgPool2d(1); then flatten
    gb.conv_classifier_head(x, cin, classes, "classifier.1", pool_hint="classifier.3")
    gb.output("output", ["N", classes])
    gb.calibrate(gb.rng.standard_normal((CALIBRATION_BATCH, 3, 224, 224)).astype("float32"))
    gb.fold_batchnorms()
    doc = (f"squeezenet1_1: torchvision structure, He-initialised weights from seed {seed}, scaled so "
           f"each conv output is normalised on a random batch; not trained.")
    return gb.model(doc)
