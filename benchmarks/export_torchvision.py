"""Export torchvision networks (seeded random weights, eval mode) to ONNX, for check_models.py.

Not a dependency of modelc: needs torch, torchvision and onnxscript, best in a venv of their own
(on these machines: `pip install torch==2.14.1 torchvision==0.29.1 onnxscript`). Each network
is exported twice, by the TorchScript exporter at opset 13 and by the dynamo exporter (opset 18,
weights as external data), since real users hand us both kinds.

    python benchmarks/export_torchvision.py -o /tmp/tv [resnet50 densenet121 ...]
    python benchmarks/export_torchvision.py -o /tmp/det --detection     # detectors: one image, TorchScript

Detectors take a list of one [3, H, W] image and end in box filtering, which modelc runs in the
data-dependent tail; the dynamo exporter does not export them here, so they come at opset 13 only.
"""
from __future__ import annotations

import argparse
import os
import warnings


def _models():
    import torchvision.models as tvm
    seg = tvm.segmentation
    return {
        "resnet50": (tvm.resnet50, 224), "resnext50_32x4d": (tvm.resnext50_32x4d, 224),
        "wide_resnet50_2": (tvm.wide_resnet50_2, 224), "densenet121": (tvm.densenet121, 224),
        "inception_v3": (lambda **k: tvm.inception_v3(aux_logits=False, init_weights=False, **k), 299),
        "googlenet": (lambda **k: tvm.googlenet(aux_logits=False, init_weights=False, **k), 224),
        "shufflenet_v2_x1_0": (tvm.shufflenet_v2_x1_0, 224), "mobilenet_v3_large": (tvm.mobilenet_v3_large, 224),
        "mobilenet_v3_small": (tvm.mobilenet_v3_small, 224), "mnasnet1_0": (tvm.mnasnet1_0, 224),
        "efficientnet_b0": (tvm.efficientnet_b0, 224), "efficientnet_v2_s": (tvm.efficientnet_v2_s, 384),
        "regnet_y_400mf": (tvm.regnet_y_400mf, 224), "convnext_tiny": (tvm.convnext_tiny, 224),
        "vit_b_16": (tvm.vit_b_16, 224), "swin_t": (tvm.swin_t, 224), "swin_v2_t": (tvm.swin_v2_t, 256),
        "maxvit_t": (tvm.maxvit_t, 224), "squeezenet1_0": (tvm.squeezenet1_0, 224),
        "alexnet": (tvm.alexnet, 224), "vgg11_bn": (tvm.vgg11_bn, 224),
        "fcn_resnet50": (lambda **k: seg.fcn_resnet50(weights_backbone=None, aux_loss=False, **k), 224),
        "lraspp_mobilenet_v3_large": (lambda **k: seg.lraspp_mobilenet_v3_large(weights_backbone=None, **k), 224),
        "deeplabv3_mobilenet_v3_large": (
            lambda **k: seg.deeplabv3_mobilenet_v3_large(weights_backbone=None, aux_loss=False, **k), 224),
        "r3d_18": (tvm.video.r3d_18, None),
    }


def _builder(name):
    """(constructor, input size) of a network this file does not list: any of torchvision's classifiers
    (224 x 224) or video classifiers (16 frames of 112 x 112, or the least its weights' card allows:
    S3D and MViT take 224 x 224), by torchvision's own registry."""
    import torchvision.models as tvm
    if name in tvm.list_models(module=tvm.video):
        meta = tvm.get_model_weights(name).DEFAULT.meta
        side = max(112, *meta.get("min_size", (112, 112)))
        return tvm.get_model_builder(name), (max(16, meta.get("min_temporal_size", 16)), side, side)
    if name in tvm.list_models(module=tvm):
        return tvm.get_model_builder(name), 224
    raise SystemExit(f"{name}: not one of torchvision's classifiers or video classifiers")


def _detectors():
    import torchvision.models.detection as D
    no = dict(weights=None, weights_backbone=None)
    return {"ssdlite320_mobilenet_v3_large": (lambda: D.ssdlite320_mobilenet_v3_large(**no), 320),
            "ssd300_vgg16": (lambda: D.ssd300_vgg16(**no), 300),
            "retinanet_resnet50_fpn": (lambda: D.retinanet_resnet50_fpn(**no), 512),
            "fcos_resnet50_fpn": (lambda: D.fcos_resnet50_fpn(**no), 512),
            "fasterrcnn_mobilenet_v3_large_320_fpn": (lambda: D.fasterrcnn_mobilenet_v3_large_320_fpn(**no), 320),
            "maskrcnn_resnet50_fpn": (lambda: D.maskrcnn_resnet50_fpn(**no), 512),
            "keypointrcnn_resnet50_fpn": (lambda: D.keypointrcnn_resnet50_fpn(**no), 512)}


def _export_detectors(names, out):
    import torch
    models = _detectors()
    for name in names or list(models):
        path = os.path.join(out, f"{name}_ts13.onnx")
        if os.path.exists(path):
            continue
        ctor, size = models[name]
        torch.manual_seed(0)
        net = ctor().eval()
        try:
            with torch.no_grad():
                torch.onnx.export(net, ([torch.rand(3, size, size)],), path, input_names=["images"],
                                  dynamo=False, opset_version=13)
            print("exported", path, flush=True)
        except Exception as e:
            print(f"not exported {path}: {type(e).__name__}: {str(e)[:300]}", flush=True)


def main(argv=None):
    import torch
    warnings.filterwarnings("ignore")
    models = _models()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"default: all of {', '.join(models)}; or any other of "
                    "torchvision's classifiers and video classifiers by name")
    ap.add_argument("-o", "--out", required=True, help="output folder")
    ap.add_argument("--detection", action="store_true",
                    help="export torchvision's detectors instead (SSD, SSDlite, RetinaNet, FCOS, Faster, Mask and "
                         "Keypoint R-CNN)")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    torch.set_num_threads(1)
    if args.detection:
        _export_detectors(args.names, args.out)
        return

    class Logits(torch.nn.Module):       # segmentation models return {"out": ...}
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            y = self.m(x)
            return y["out"] if isinstance(y, dict) else y

    for name in args.names or list(models):
        ctor, size = models[name] if name in models else _builder(name)
        torch.manual_seed(0)
        net = Logits(ctor(weights=None).eval()).eval()
        with torch.no_grad():              # zero-initialised heads (ViT's) would make every output 0
            for p in net.parameters():
                if p.dim() > 1 and not p.any():
                    torch.nn.init.normal_(p, std=0.02)
        x = torch.randn(1, 3, 16, 112, 112) if size is None else \
            torch.randn(1, 3, *size) if isinstance(size, tuple) else torch.randn(1, 3, size, size)
        for tag, kw in [("ts13", dict(dynamo=False, opset_version=13)), ("dynamo", dict(dynamo=True))]:
            path = os.path.join(args.out, f"{name}_{tag}.onnx")
            if os.path.exists(path):
                continue
            try:
                with torch.no_grad():
                    torch.onnx.export(net, (x,), path, input_names=["input"], output_names=["output"], **kw)
                print("exported", path, flush=True)
            except Exception as e:       # an exporter limit, not ours: say so and go on
                print(f"not exported {path}: {type(e).__name__}: {str(e)[:300]}", flush=True)


if __name__ == "__main__":
    main()
