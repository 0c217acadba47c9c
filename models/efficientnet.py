"""EfficientNet-B0 with torchvision's exact structure in eval mode, seeded and BN-calibrated.

Eval mode: stochastic depth is the identity and the classifier's Dropout is dropped. SiLU is
Sigmoid + Mul, as the exporter writes it.
"""
from __future__ import annotations

import onnx

from ._builder import GraphBuilder

# torchvision's MBConvConfig for B0 (width and depth multipliers 1.0): expand ratio, kernel,
# first stride, input channels, output channels, layers
SETTINGS = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
            (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1))
STEM_CHANNELS = 32
LAST_CHANNELS = 4 * 320
SE_REDUCTION = 4          # squeeze channels: max(1, block input channels // 4)
CALIBRATION_BATCH = 8


def _squeeze_excitation(gb: GraphBuilder, x, channels, squeeze, prefix):
    """x * Sigmoid(fc2(SiLU(fc1(GlobalAveragePool(x))))), fc1 and fc2 1x1 convs with bias."""
    s = gb.op("GlobalAveragePool", [x], f"{prefix}.avgpool")
    s = gb.silu(gb.conv(s, channels, squeeze, 1, f"{prefix}.fc1", bias=True), f"{prefix}.activation")
    s = gb.conv(s, squeeze, channels, 1, f"{prefix}.fc2", bias=True)
    s = gb.op("Sigmoid", [s], f"{prefix}.scale_activation")
    return gb.op("Mul", [s, x], prefix)


def _mbconv(gb: GraphBuilder, x, cin, cout, kernel, stride, expand, prefix):
    """[expand 1x1-BN-SiLU] -> depthwise kxk/stride-BN-SiLU -> squeeze-excitation -> project
    1x1-BN [+ x]."""
    hidden = cin * expand
    y, i = x, 0
    if hidden != cin:
        y = gb.conv_bn(y, cin, hidden, 1, f"{prefix}.block.0.0", act="silu", bn_hint=f"{prefix}.block.0.1")
        i = 1
    y = gb.conv_bn(y, hidden, hidden, kernel, f"{prefix}.block.{i}.0", stride=stride, groups=hidden, act="silu",
                   bn_hint=f"{prefix}.block.{i}.1")
    y = _squeeze_excitation(gb, y, hidden, max(1, cin // SE_REDUCTION), f"{prefix}.block.{i + 1}")
    y = gb.conv_bn(y, hidden, cout, 1, f"{prefix}.block.{i + 2}.0", bn_hint=f"{prefix}.block.{i + 2}.1")
    if stride == 1 and cin == cout:
        y = gb.op("Add", [y, x], prefix)
    return y


def efficientnet_b0(seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    gb = GraphBuilder("efficientnet_b0", seed)
    x = gb.input("input", ["N", 3, 224, 224])
    x = gb.conv_bn(x, 3, STEM_CHANNELS, 3, "features.0.0", stride=2, act="silu", bn_hint="features.0.1")
    for stage, (expand, kernel, stride, cin, cout, layers) in enumerate(SETTINGS, start=1):
        for i in range(layers):
            x = _mbconv(gb, x, cin if i == 0 else cout, cout, kernel, stride if i == 0 else 1, expand,
                        f"features.{stage}.{i}")
    last = len(SETTINGS) + 1
    x = gb.conv_bn(x, SETTINGS[-1][4], LAST_CHANNELS, 1, f"features.{last}.0", act="silu",
                   bn_hint=f"features.{last}.1")
    gb.classifier_head(x, LAST_CHANNELS, classes, hint="classifier.1")
    gb.output("output", ["N", classes])
    batch = gb.rng.standard_normal((CALIBRATION_BATCH, 3, 224, 224)).astype("float32")
    doc = (f"efficientnet_b0: torchvision structure (eval mode), He-initialised weights from seed {seed}, "
           f"BatchNorm statistics calibrated on a random batch; not trained.")
    return gb.model(doc, calibration_batch=batch)
