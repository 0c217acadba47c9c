"""ResNet-18/34 (BasicBlock) and ResNet-50 (Bottleneck, torchvision's v1.5: the stride on the 3x3
conv) with torchvision's exact structure, seeded and BN-calibrated."""
from __future__ import annotations

import onnx

from ._builder import GraphBuilder

WIDTHS = (64, 128, 256, 512)
BOTTLENECK_EXPANSION = 4
# scale of each bottleneck's last BatchNorm (the residual branch's output), small in the spirit of
# torchvision's zero_init_residual (which starts it at 0): at ~1 the random 16-block network is
# chaotic, float32 rounding grows ~1.3x per block, and onnxruntime's output is ~1e-4 of its scale
# away from the exact (float64) one; at 0.25 it is ~4e-6
RESIDUAL_GAMMA = 0.25
CALIBRATION_BATCH = 8


def _basic_block(gb: GraphBuilder, x, cin, cout, stride, prefix):
    """conv3x3-BN-ReLU, conv3x3-BN, + identity (or 1x1/stride conv-BN downsample), ReLU."""
    y = gb.conv_bn(x, cin, cout, 3, f"{prefix}.conv1", stride=stride, act="relu", bn_hint=f"{prefix}.bn1")
    y = gb.conv_bn(y, cout, cout, 3, f"{prefix}.conv2", bn_hint=f"{prefix}.bn2")
    if stride != 1 or cin != cout:
        x = gb.conv_bn(x, cin, cout, 1, f"{prefix}.downsample.0", stride=stride,
                       bn_hint=f"{prefix}.downsample.1")
    return gb.relu(gb.op("Add", [y, x], prefix), prefix)


def _bottleneck(gb: GraphBuilder, x, cin, width, stride, prefix):
    """conv1x1-BN-ReLU, conv3x3/stride-BN-ReLU, conv1x1 (4x width)-BN, + identity (or 1x1/stride
    conv-BN downsample), ReLU."""
    cout = width * BOTTLENECK_EXPANSION
    y = gb.conv_bn(x, cin, width, 1, f"{prefix}.conv1", act="relu", bn_hint=f"{prefix}.bn1")
    y = gb.conv_bn(y, width, width, 3, f"{prefix}.conv2", stride=stride, act="relu", bn_hint=f"{prefix}.bn2")
    y = gb.conv_bn(y, width, cout, 1, f"{prefix}.conv3", bn_hint=f"{prefix}.bn3", gamma=RESIDUAL_GAMMA)
    if stride != 1 or cin != cout:
        x = gb.conv_bn(x, cin, cout, 1, f"{prefix}.downsample.0", stride=stride,
                       bn_hint=f"{prefix}.downsample.1")
    return gb.relu(gb.op("Add", [y, x], prefix), prefix)


# torchvision's block classes: how a stage's blocks are built and their output width / stage width
BLOCKS = {"BasicBlock": (_basic_block, 1), "Bottleneck": (_bottleneck, BOTTLENECK_EXPANSION)}


def _resnet(name: str, depths, seed: int, block: str = "BasicBlock", classes: int = 1000) -> onnx.ModelProto:
    gb = GraphBuilder(name, seed)
    x = gb.input("input", ["N", 3, 224, 224])
    x = gb.conv_bn(x, 3, 64, 7, "conv1", stride=2, act="relu", bn_hint="bn1")
    x = gb.op("MaxPool", [x], "maxpool", ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3],
              pads=[1, 1, 1, 1], strides=[2, 2])
    make_block, expansion = BLOCKS[block]
    cin = 64
    for stage, (width, depth) in enumerate(zip(WIDTHS, depths), start=1):
        for i in range(depth):
            stride = 2 if stage > 1 and i == 0 else 1
            x = make_block(gb, x, cin, width, stride, f"layer{stage}.{i}")
            cin = width * expansion
    gb.classifier_head(x, cin, classes)
    gb.output("output", ["N", classes])
    batch = gb.rng.standard_normal((CALIBRATION_BATCH, 3, 224, 224)).astype("float32")
    doc = (f"{name}: torchvision structure ({block} {list(depths)}), He-initialised weights from "
           f"seed {seed}, BatchNorm statistics calibrated on a random batch; not trained.")
    return gb.model(doc, calibration_batch=batch)


def resnet18(seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnet18", (2, 2, 2, 2), seed)


def resnet34(seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnet34", (3, 4, 6, 3), seed)


def resnet50(seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnet50", (3, 4, 6, 3), seed, block="Bottleneck")
