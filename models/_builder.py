"""GraphBuilder: the shared machinery of the example-model builders.

A builder adds nodes and seeded initializers with unique, exporter-like names, knows the common
layers (conv + BatchNorm, ReLU6 as Clip, SiLU as Sigmoid + Mul, the classifier heads, linear,
LayerNorm, Erf-GELU) and finally calibrates the network: random weights alone give activations that
explode or vanish and a classifier whose top-1 never changes, so every BatchNorm gets the actual
statistics of its input on a seeded random batch (one onnxruntime run of a graph where each
BatchNorm normalises with batch statistics) and the classifier is centred and scaled on the same
batch. A network without BatchNorm (SqueezeNet) is built with one after each conv, calibrated, and
then has them folded into the convs' weights and biases (`fold_batchnorms`).
"""
from __future__ import annotations

import collections

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # the lowest IR version that carries opset 17: readable by old runtimes too
PRODUCER = "modelc.models"
BN_EPS = 1e-5
LN_EPS = 1e-5


class GraphBuilder:
    """Accumulates nodes and initializers; `model()` turns them into a checked ModelProto."""

    def __init__(self, name: str, seed: int = 0, opset: int = OPSET):
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, np.ndarray] = {}
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._used: collections.Counter = collections.Counter()
        self._shared: dict = {}
        self.bns: list[dict] = []        # BatchNorms awaiting calibration
        self.classifier: dict | None = None

    # ---- names, tensors, nodes -------------------------------------------------------------
    def unique(self, hint: str) -> str:
        n = self._used[hint]
        self._used[hint] += 1
        return hint if n == 0 else f"{hint}_{n}"

    def const(self, value, hint: str) -> str:
        name = self.unique(hint)
        self.inits[name] = np.asarray(value)
        return name

    def shared(self, value, dtype=np.float32, hint: str | None = None) -> str:
        """One initializer per distinct constant (scalars, reshape shapes), as exporters do."""
        arr = np.asarray(value, dtype=dtype)
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._shared:
            default = f"const_{arr.item():g}" if arr.size == 1 else "const_" + "_".join(map(str, arr.ravel()))
            self._shared[key] = self.const(arr, hint or default)
        return self._shared[key]

    def op(self, op_type: str, inputs, hint: str, out: str | None = None, **attrs) -> str:
        """Add one single-output node named `{hint}/{op_type}`; returns its output name."""
        name = self.unique(f"/{hint}/{op_type}")
        output = out or self.unique(f"{name}_output_0")
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=name, **attrs))
        return output

    def input(self, name: str, shape, elem_type=TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, shape, elem_type=TensorProto.FLOAT) -> str:
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def normal(self, shape, std: float) -> np.ndarray:
        return (self.rng.standard_normal(shape) * std).astype(np.float32)

    # ---- layers ----------------------------------------------------------------------------
    def conv(self, x, cin, cout, k, hint, stride=1, groups=1, bias=False, pad=None) -> str:
        """Conv with He-initialised weights (std sqrt(2/fan_in)) and padding `pad`, by default the
        'same'-style k//2."""
        fan_in = cin // groups * k * k
        w = self.const(self.normal((cout, cin // groups, k, k), np.sqrt(2.0 / fan_in)), f"{hint}.weight")
        ins = [x, w] + ([self.const(np.zeros(cout, np.float32), f"{hint}.bias")] if bias else [])
        p = k // 2 if pad is None else pad
        return self.op("Conv", ins, hint, dilations=[1, 1], group=groups, kernel_shape=[k, k],
                       pads=[p, p, p, p], strides=[stride, stride])

    def batchnorm(self, x, c, hint, gamma=1.0) -> str:
        """BatchNorm with scale ~ `gamma` (+-10%), small beta; mean/var are placeholders until
        `calibrate`."""
        names = [self.const(gamma * (1.0 + self.normal(c, 0.1)), f"{hint}.weight"),
                 self.const(self.normal(c, 0.1), f"{hint}.bias"),
                 self.const(np.zeros(c, np.float32), f"{hint}.running_mean"),
                 self.const(np.ones(c, np.float32), f"{hint}.running_var")]
        y = self.op("BatchNormalization", [x] + names, hint, epsilon=BN_EPS, momentum=0.9)
        self.bns.append({"node": self.nodes[-1], "scale": names[0], "bias": names[1],
                         "mean": names[2], "var": names[3]})
        return y

    def relu(self, x, hint) -> str:
        return self.op("Relu", [x], hint)

    def relu6(self, x, hint) -> str:
        """ReLU6 in its opset >= 11 form: Clip with min/max as constant inputs."""
        return self.op("Clip", [x, self.shared(0.0), self.shared(6.0)], hint)

    def silu(self, x, hint) -> str:
        """SiLU as exporters decompose it: x * Sigmoid(x)."""
        return self.op("Mul", [x, self.op("Sigmoid", [x], hint)], hint)

    def activation(self, x, act, hint) -> str:
        """`act` ("relu", "relu6", "silu" or None) applied to `x`."""
        if act is None:
            return x
        if act not in ("relu", "relu6", "silu"):
            raise ValueError(f"unknown activation {act!r}")
        return getattr(self, act)(x, hint)

    def conv_bn(self, x, cin, cout, k, hint, stride=1, groups=1, act=None, bn_hint=None, pad=None,
                gamma=1.0) -> str:
        """Conv (no bias) + BatchNorm (scale ~ `gamma`) + optional activation ("relu", "relu6" or
        "silu")."""
        y = self.conv(x, cin, cout, k, hint, stride=stride, groups=groups, pad=pad)
        y = self.batchnorm(y, cout, bn_hint or f"{hint}_bn", gamma=gamma)
        return self.activation(y, act, hint)

    def classifier_head(self, x, cin, classes, hint="fc", out="output") -> str:
        """GlobalAveragePool + Flatten + Gemm(transB=1); centred and scaled by `calibrate`."""
        y = self.op("GlobalAveragePool", [x], "avgpool")
        feats = self.op("Flatten", [y], "flatten", axis=1)
        w = self.const(self.normal((classes, cin), 1.0 / np.sqrt(cin)), f"{hint}.weight")
        b = self.const(np.zeros(classes, np.float32), f"{hint}.bias")
        self.classifier = {"kind": "gemm", "features": feats, "weight": w, "bias": b}
        return self.op("Gemm", [feats, w, b], hint, out=out, alpha=1.0, beta=1.0, transB=1)

    def conv_classifier_head(self, x, cin, classes, hint, pool_hint="avgpool", out="output") -> str:
        """SqueezeNet's head: Conv 1x1 (bias) + ReLU + GlobalAveragePool + Flatten; `calibrate`
        normalises each class's pre-activation and scales the pooled logits to unit spread."""
        y = self.conv(x, cin, classes, 1, hint, bias=True)
        w, b = self.nodes[-1].input[1:]
        y = self.op("GlobalAveragePool", [self.relu(y, hint)], pool_hint)
        self.classifier = {"kind": "conv_relu_pool", "features": x, "weight": w, "bias": b}
        return self.op("Flatten", [y], "flatten", out=out, axis=1)

    def linear(self, x, din, dout, hint, std=None, out=None) -> str:
        """MatMul + Add (bias), the form exporters emit for nn.Linear on 3-D inputs."""
        w = self.const(self.normal((din, dout), std if std is not None else 1.0 / np.sqrt(din)),
                       f"{hint}.weight")
        b = self.const(self.normal(dout, 0.02), f"{hint}.bias")
        return self.op("Add", [self.op("MatMul", [x, w], hint), b], hint, out=out)

    def layernorm(self, x, dim, hint, out=None) -> str:
        scale = self.const(1.0 + self.normal(dim, 0.05), f"{hint}.weight")
        bias = self.const(self.normal(dim, 0.05), f"{hint}.bias")
        return self.op("LayerNormalization", [x, scale, bias], hint, out=out, axis=-1, epsilon=LN_EPS)

    def gelu(self, x, hint) -> str:
        """Exact GELU as exporters decompose it: x * 0.5 * (1 + Erf(x / sqrt(2)))."""
        e = self.op("Erf", [self.op("Div", [x, self.shared(np.sqrt(2.0))], hint)], hint)
        y = self.op("Mul", [x, self.op("Add", [e, self.shared(1.0)], hint)], hint)
        return self.op("Mul", [y, self.shared(0.5)], hint)

    # ---- finishing ---------------------------------------------------------------------------
    def calibrate(self, batch: np.ndarray) -> None:
        """Set every BatchNorm's statistics to those of its input on `batch` and centre the
        classifier, so activations are normalised and the top-1 class depends on the input."""
        if not self.bns and self.classifier is None:
            return
        calib, stat_names = self._calibration_model()
        results = _run(calib, {self.inputs[0].name: batch})
        for bn, (m, v) in zip(self.bns, stat_names):
            self.inits[bn["mean"]] = results[m].reshape(-1).astype(np.float32)
            self.inits[bn["var"]] = results[v].reshape(-1).astype(np.float32)
        if self.classifier is not None:
            self._calibrate_classifier(results[self.classifier["features"]].astype(np.float64))

    def _calibrate_classifier(self, feats: np.ndarray) -> None:
        head = self.classifier
        w = self.inits[head["weight"]].astype(np.float64)
        if head["kind"] == "gemm":
            mu = feats.mean(axis=0)
            logits = (feats - mu) @ w.T
            s = logits.std() or 1.0
            self.inits[head["weight"]] = (w / s).astype(np.float32)
            self.inits[head["bias"]] = (-(w @ mu) / s).astype(np.float32)
            return
        # conv 1x1 + ReLU + average pool: ReLU(a (z - mu) / sigma) per class is positively
        # homogeneous in a, so the pooled logits of a = 1 give the a that makes their spread one
        z = np.einsum("nchw,kc->nkhw", feats, w[:, :, 0, 0])
        mu, sigma = z.mean(axis=(0, 2, 3)), z.std(axis=(0, 2, 3))
        sigma[sigma == 0] = 1.0
        pooled = np.maximum((z - mu[:, None, None]) / sigma[:, None, None], 0).mean(axis=(2, 3))
        a = 1.0 / (pooled.std() or 1.0)
        self.inits[head["weight"]] = (w * (a / sigma)[:, None, None, None]).astype(np.float32)
        self.inits[head["bias"]] = (-a * mu / sigma).astype(np.float32)

    def fold_batchnorms(self) -> None:
        """Fold every (calibrated) BatchNorm into the bias-free Conv that feeds it and drop it: a
        network without BatchNorm gets the scales of one whose every conv output is normalised."""
        producers = {n.output[0]: n for n in self.nodes}
        renamed, dropped = {}, set()
        for bn in self.bns:
            node = bn["node"]
            conv = producers[node.input[0]]
            if conv.op_type != "Conv" or len(conv.input) != 2:
                raise ValueError(f"{node.name}: only a BatchNorm after a bias-free Conv can be folded")
            scale, var = (self.inits[bn[key]].astype(np.float64) for key in ("scale", "var"))
            k = scale / np.sqrt(var + BN_EPS)
            w = conv.input[1]
            self.inits[w] = (self.inits[w] * k[:, None, None, None]).astype(np.float32)
            bias = self.inits[bn["bias"]] - self.inits[bn["mean"]] * k
            conv.input.append(self.const(bias.astype(np.float32), w.removesuffix(".weight") + ".bias"))
            for key in ("scale", "bias", "mean", "var"):
                del self.inits[bn[key]]
            renamed[node.output[0]] = conv.output[0]
            dropped.add(id(node))
        self.nodes = [n for n in self.nodes if id(n) not in dropped]
        for n in self.nodes:
            for i, name in enumerate(n.input):
                if name in renamed:
                    n.input[i] = renamed[name]
        self.bns = []

    def _calibration_model(self):
        """A copy of the graph where each BatchNorm normalises with the batch statistics of its
        input (training-mode semantics, momentum 0) and exposes them as graph outputs."""
        nodes, extra_inits, stat_names, outputs = [], {}, [], []
        bn_nodes = {id(bn["node"]): bn for bn in self.bns}
        for node in self.nodes:
            bn = bn_nodes.get(id(node))
            if bn is None:
                nodes.append(node)
                continue
            x, y, p = node.input[0], node.output[0], node.name
            c = self.inits[bn["scale"]].size
            extra_inits[p + ".g"] = self.inits[bn["scale"]].reshape(1, c, 1, 1)
            extra_inits[p + ".b"] = self.inits[bn["bias"]].reshape(1, c, 1, 1)
            extra_inits[p + ".eps"] = np.array(BN_EPS, np.float32)
            mk = helper.make_node
            nodes += [
                mk("ReduceMean", [x], [p + ".mean"], axes=[0, 2, 3], keepdims=1),
                mk("Sub", [x, p + ".mean"], [p + ".d"]),
                mk("Mul", [p + ".d", p + ".d"], [p + ".d2"]),
                mk("ReduceMean", [p + ".d2"], [p + ".var"], axes=[0, 2, 3], keepdims=1),
                mk("Add", [p + ".var", p + ".eps"], [p + ".ve"]),
                mk("Sqrt", [p + ".ve"], [p + ".std"]),
                mk("Div", [p + ".g", p + ".std"], [p + ".k"]),
                mk("Mul", [p + ".d", p + ".k"], [p + ".dk"]),
                mk("Add", [p + ".dk", p + ".b"], [y]),
            ]
            stat_names.append((p + ".mean", p + ".var"))
            outputs += [p + ".mean", p + ".var"]
        if self.classifier is not None:
            outputs.append(self.classifier["features"])
        inits = {**self.inits, **extra_inits}
        graph = helper.make_graph(
            nodes, self.name + "_calibration", self.inputs,
            [helper.make_empty_tensor_value_info(o) for o in outputs],
            [numpy_helper.from_array(v, k) for k, v in inits.items()])
        return self._wrap(graph, "calibration graph"), stat_names

    def _wrap(self, graph, doc: str) -> onnx.ModelProto:
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)],
                                  producer_name=PRODUCER, doc_string=doc)
        model.ir_version = IR_VERSION
        return model

    def model(self, doc: str, calibration_batch: np.ndarray | None = None) -> onnx.ModelProto:
        """Calibrate (if a batch is given), then assemble and fully check the ModelProto."""
        if calibration_batch is not None:
            self.calibrate(calibration_batch)
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs,
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()], doc_string=doc)
        model = self._wrap(graph, doc)
        onnx.checker.check_model(model, full_check=True)
        return model


def _run(model: onnx.ModelProto, feeds: dict) -> dict:
    """Run `model` once in onnxruntime with a fixed thread count (reproducible reductions)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))
