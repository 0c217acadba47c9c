"""Workloads and models the tests share, built by hand so that each test names its case.

Kernel workloads are the JSON that `extract.workload_of` writes (inputs, fused ops, params,
outputs, layouts), wrapped in `Workload`; `onnx_model` is the one-graph ONNX model the frontend,
pass and fuzz tests start from. Imported as a plain module (`from workloads import ...`): pytest
puts tests/ on sys.path, as the tests have no package.
"""
from onnx import helper

from modelc.kernels.layout import choose_block
from modelc.kernels.workload import Workload
from modelc.ops.linalg import matmul_shape
from modelc.ops.window import window_geometry

CLIP = {"p0": {"dtype": "float32", "shape": [], "value": 0.0},
        "p1": {"dtype": "float32", "shape": [], "value": 6.0}}


def onnx_model(nodes, inputs, outputs, inits=(), opset=17, ir_version=None):
    """A one-graph model of `nodes` at `opset` of the default domain."""
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    if ir_version:
        m.ir_version = ir_version
    return m


# ---- convolutions ------------------------------------------------------------------------------

def conv_wl(x_shape, w_shape, *, op="Conv", group=1, strides=None, dilations=None, pads=None,
            bias=True, clip=False, relu=False, res=False, x_layout=None, out_layout=None,
            res_layout=None, extra_attrs=None, outputs="last", dtype="float32"):
    """A fused Conv (+ bias) [+ Clip(0, 6) | Relu] [+ residual Add] workload."""
    nd = len(x_shape) - 2
    strides = strides or [1] * nd
    dilations = dilations or [1] * nd
    pads = pads if pads is not None else [0] * (2 * nd)
    attrs = {"kernel_shape": list(w_shape[2:]), "strides": strides, "dilations": dilations,
             "group": group}
    if op == "Conv":
        attrs["pads"] = pads
        k_out = w_shape[0]
        o_sp = [(x_shape[2 + i] + pads[i] + pads[nd + i] - dilations[i] * (w_shape[2 + i] - 1) - 1)
                // strides[i] + 1 for i in range(nd)]
    else:
        attrs["pads"] = pads
        attrs.update(extra_attrs or {})
        k_out = w_shape[1] * group
        opad = attrs.get("output_padding", [0] * nd)
        o_sp = [strides[i] * (x_shape[2 + i] - 1) + opad[i] + (w_shape[2 + i] - 1) * dilations[i] + 1
                - pads[i] - pads[nd + i] for i in range(nd)]
    out_shape = [x_shape[0], k_out] + o_sp
    inputs = [{"shape": list(x_shape), "dtype": dtype, "const": False, "layout": x_layout},
              {"shape": list(w_shape), "dtype": dtype, "const": True}]
    args = ["i0", "i1"]
    if bias:
        inputs.append({"shape": [k_out], "dtype": dtype, "const": True})
        args.append("i2")
    ops = [{"op": op, "attrs": attrs, "args": args}]
    params = {}
    if clip:
        params = {k: dict(v, dtype=dtype) for k, v in CLIP.items()}
        ops.append({"op": "Clip", "attrs": {}, "args": [f"v{len(ops) - 1}", "p0", "p1"]})
    if relu:
        ops.append({"op": "Relu", "attrs": {}, "args": [f"v{len(ops) - 1}"]})
    if res:
        inputs.append({"shape": out_shape, "dtype": dtype, "const": False, "layout": res_layout})
        ops.append({"op": "Add", "attrs": {}, "args": [f"v{len(ops) - 1}", f"i{len(inputs) - 1}"]})
    values = [f"v{len(ops) - 1}"] if outputs == "last" else [f"v{j}" for j in range(len(ops))]
    return Workload({"version": 1, "inputs": inputs, "ops": ops, "params": params,
                     "outputs": [{"shape": out_shape, "dtype": dtype, "value": v, "layout": out_layout}
                                 for v in values]})


def dw_wl(c, h, w=None, k=3, s=1, p=1, d=1, hin=1, hout=0, clip=True, res=False, bias=True, n=1):
    """A MobileNetV2-style depthwise conv in the blocked layout."""
    b = choose_block(c)
    return conv_wl([n, c, h, w or h], [c, 1, k, k], group=c, strides=[s, s], dilations=[d, d],
                   pads=[p] * 4, bias=bias, clip=clip, res=res, x_layout=[b, hin],
                   out_layout=[b, hout], res_layout=[b, 0])


def conv2d_wl(C, H, W, K, k, s, p, hin, hout, bias=True, residual=False, act="Relu", dil=1):
    """A batch-1 square-kernel Conv (+ bias) [+ residual] [+ Relu | Clip(0, 6)] in the blocked
    layout (`hin`/`hout`: input and output halos), the conv2d template's workload."""
    OH = (H + 2 * p - dil * (k - 1) - 1) // s + 1
    OW = (W + 2 * p - dil * (k - 1) - 1) // s + 1
    cb, kb = choose_block(C), choose_block(K)
    inputs = [{"shape": [1, C, H, W], "dtype": "float32", "const": False, "layout": [cb, hin]},
              {"shape": [K, C, k, k], "dtype": "float32", "const": True}]
    args = ["i0", "i1"]
    if bias:
        inputs.append({"shape": [K], "dtype": "float32", "const": True})
        args.append("i2")
    ops = [{"op": "Conv", "attrs": {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4,
                                     "dilations": [dil, dil], "group": 1}, "args": args}]
    params = {}
    if residual:
        inputs.append({"shape": [1, K, OH, OW], "dtype": "float32", "const": False, "layout": [kb, 0]})
        ops.append({"op": "Add", "attrs": {}, "args": [f"v{len(ops) - 1}", f"i{len(inputs) - 1}"]})
    if act == "Relu":
        ops.append({"op": "Relu", "attrs": {}, "args": [f"v{len(ops) - 1}"]})
    elif act == "Clip":
        params = {k: dict(v) for k, v in CLIP.items()}
        ops.append({"op": "Clip", "attrs": {}, "args": [f"v{len(ops) - 1}", "p0", "p1"]})
    elif act == "Swish":
        ops.append({"op": "Swish", "attrs": {}, "args": [f"v{len(ops) - 1}"]})
    return Workload({"version": 1, "inputs": inputs, "ops": ops, "params": params,
                     "outputs": [{"shape": [1, K, OH, OW], "dtype": "float32", "value": f"v{len(ops) - 1}",
                                  "layout": [kb, hout]}]})


# ---- dense and matmul ----------------------------------------------------------------------------

def with_epilogue(ops, inputs, params, out, epi):
    """The workload JSON of `ops` followed by epilogues `epi`: "res" (a residual input), Mul/Div/Add
    by a scalar, or a unary op by name; `out` is the anchor's output shape."""
    for e in epi:
        prev = f"v{len(ops) - 1}"
        if e == "res":
            inputs.append({"shape": list(out), "dtype": "float32", "const": False})
            ops.append({"op": "Add", "attrs": {}, "args": [prev, f"i{len(inputs) - 1}"]})
        elif e in ("Mul", "Div", "Add"):
            p = f"p{len(params)}"
            params[p] = {"dtype": "float32", "shape": [], "value": 0.125 if e == "Div" else 1.5}
            ops.append({"op": e, "attrs": {}, "args": [prev, p]})
        else:
            ops.append({"op": e, "attrs": {}, "args": [prev]})
    return {"version": 1, "inputs": inputs, "ops": ops, "params": params,
            "outputs": [{"shape": list(out), "dtype": "float32", "value": f"v{len(ops) - 1}"}]}


def dense_wl(x_shape, n, bias=True, epi=(), x_layout=None):
    """x[..., K] @ w[K, n] (+ bias) [+ epilogue]."""
    k = x_shape[-1]
    inputs = [{"shape": list(x_shape), "dtype": "float32", "const": False, "layout": x_layout},
              {"shape": [k, n], "dtype": "float32", "const": True}]
    args = ["i0", "i1"]
    if bias:
        inputs.append({"shape": [n], "dtype": "float32", "const": True})
        args.append("i2")
    return with_epilogue([{"op": "Dense", "attrs": {}, "args": args}], inputs, {},
                         tuple(x_shape[:-1]) + (n,), epi)


def matmul_wl(a_shape, b_shape, epi=(), b_const=False):
    """numpy-semantics MatMul [+ epilogue]."""
    inputs = [{"shape": list(a_shape), "dtype": "float32", "const": False},
              {"shape": list(b_shape), "dtype": "float32", "const": b_const}]
    return with_epilogue([{"op": "MatMul", "attrs": {}, "args": ["i0", "i1"]}], inputs, {},
                         matmul_shape(tuple(a_shape), tuple(b_shape)), epi)


# ---- pools and reductions ----------------------------------------------------------------------

def pool_wl(op, N, C, H, W, k=(3, 3), s=(2, 2), pads=(1, 1, 1, 1), d=(1, 1), ceil=0, cip=0,
            lin=None, lout=None, epi=(), indices=False):
    """A 2-d pool [+ epilogue: relu, add_channel, half] in the plain or blocked layout (`lin`,
    `lout`); `indices` adds MaxPool's second output."""
    attrs, OH, OW = {}, 1, 1
    if not op.startswith("Global"):
        OH, OW = window_geometry((H, W), k, s, d, pads, "NOTSET", ceil).out
        attrs = {"kernel_shape": list(k), "strides": list(s), "pads": list(pads), "dilations": list(d)}
        if ceil:
            attrs["ceil_mode"] = 1
        if cip:
            attrs["count_include_pad"] = 1
    x = {"shape": [N, C, H, W], "dtype": "float32", "const": False}
    if lin:
        x["layout"] = list(lin)
    inputs, ops, params = [x], [{"op": op, "attrs": attrs, "args": ["i0"]}], {}
    ref = "v0.0" if indices else "v0"
    for e in epi:
        prev = f"v{len(ops) - 1}" if len(ops) > 1 else ref
        if e == "relu":
            ops.append({"op": "Relu", "attrs": {}, "args": [prev]})
        elif e == "add_channel":
            inputs.append({"shape": [C, 1, 1], "dtype": "float32", "const": True})
            ops.append({"op": "Add", "attrs": {}, "args": [prev, f"i{len(inputs) - 1}"]})
        elif e == "half":
            params[f"p{len(params)}"] = {"dtype": "float32", "shape": [], "value": 0.5}
            ops.append({"op": "Mul", "attrs": {}, "args": [prev, f"p{len(params) - 1}"]})
    out = {"shape": [N, C, OH, OW], "dtype": "float32", "value": f"v{len(ops) - 1}" if len(ops) > 1 else ref}
    if lout:
        out["layout"] = list(lout)
    outputs = [out]
    if indices:
        outputs.append({"shape": [N, C, OH, OW], "dtype": "int64", "value": "v0.1"})
    return Workload({"version": 1, "inputs": inputs, "ops": ops, "params": params, "outputs": outputs})


def red_wl(op, shape, attrs=None, axes=None, scale=None, bias=None, epi=()):
    """A reduction-family op (reduce, softmax, layer norm: `scale`/`bias` are constant inputs)
    [+ epilogue: relu, half, ("add", shape)]."""
    inputs, args, params = [{"shape": list(shape), "dtype": "float32", "const": False}], ["i0"], {}
    if axes is not None:
        params["p0"] = {"dtype": "int64", "shape": [len(axes)], "value": list(axes)}
        args.append("p0")
    for extra in (scale, bias):
        if extra is not None:
            inputs.append({"shape": list(extra), "dtype": "float32", "const": True})
            args.append(f"i{len(inputs) - 1}")
    ops = [{"op": op, "attrs": dict(attrs or {}), "args": args}]
    for e in epi:
        prev = f"v{len(ops) - 1}"
        if e == "relu":
            ops.append({"op": "Relu", "attrs": {}, "args": [prev]})
        elif e == "half":
            params[f"p{len(params)}"] = {"dtype": "float32", "shape": [], "value": 0.5}
            ops.append({"op": "Mul", "attrs": {}, "args": [prev, f"p{len(params) - 1}"]})
        else:                                   # ("add", shape): a broadcast tensor input
            inputs.append({"shape": list(e[1]), "dtype": "float32", "const": False})
            ops.append({"op": "Add", "attrs": {}, "args": [prev, f"i{len(inputs) - 1}"]})
    wl = {"version": 1, "inputs": inputs, "ops": ops, "params": params,
          "outputs": [{"shape": [1], "dtype": "float32", "value": f"v{len(ops) - 1}"}]}
    wl["outputs"][0]["shape"] = list(Workload(wl).spec(f"v{len(ops) - 1}").shape)
    return Workload(wl)
