"""Fuzzing: mutated models through from_onnx, compile and run never end in a raw exception.

Hypothesis mutates a few tiny valid models (a conv+relu+pool, a small MLP, a reshape/transpose/
concat/slice chain, broadcasting elementwise ops, a pad/pool/reduce/gather mix): input and
initializer shapes (zero, negative and huge dims), attributes (removed, added, wrong types and
values), node inputs (dropped, missing tensors, extra), dtypes, op types, opsets, duplicate names,
cycles, empty graphs and truncated or bit-flipped bytes. Each mutated model goes through
`modelc.from_onnx`, `modelc.compile` and `Module.run` with a random input of the declared shape.

The outcome must be success or a `ModelcError` whose message is a short line or so (not a wrapped
TypeError/KeyError/... from inside modelc); a raw exception, a crash of the process (segfault,
LLVM abort) or a hang fails the test. A success is also run by onnxruntime on the same inputs: a
different result fails the test (differences only where a NaN or inf weight makes the IEEE corner
cases of fast-math kernels show are tallied, not failed). The cases run in a worker process
(spawned once, restarted after a crash or a timeout) so that neither can take pytest down; its
address space is capped so that a huge allocation fails instead of swapping.

The examples are derandomized (the same cases on every run) and bounded (about 50 s from an empty
kernel cache on 2 cores, 15 s warm). For a longer local run: MODELC_FUZZ_EXAMPLES=5000, and
MODELC_FUZZ_SEED=n for other cases than CI's, MODELC_FUZZ_VERBOSE=1 to print every case. The test
prints a tally of the outcomes by kind; the tests after it keep one case of each bug it found.
"""
from __future__ import annotations

import collections
import multiprocessing
import os
import re
import time
import traceback

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from onnx import AttributeProto, TensorProto, helper, numpy_helper

pytestmark = pytest.mark.filterwarnings("ignore:onnx.checker rejects the model")

MAX_EXAMPLES = int(os.environ.get("MODELC_FUZZ_EXAMPLES", "1000"))
TIMEOUT = float(os.environ.get("MODELC_FUZZ_TIMEOUT", "90"))    # seconds per case, compile included
SEED = int(os.environ["MODELC_FUZZ_SEED"]) if os.environ.get("MODELC_FUZZ_SEED") else None  # explore
DEEP = bool(os.environ.get("MODELC_FUZZ_DEEP"))      # local runs: only mutations that keep models valid-ish
VERBOSE = bool(os.environ.get("MODELC_FUZZ_VERBOSE"))                # print every case and outcome
ADDRESS_SPACE = 8 << 30                                           # the worker's RLIMIT_AS

F = TensorProto.FLOAT


# ---- the valid models mutations start from ---------------------------------------------------------

def _vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def _init(name, rng, shape, dtype=np.float32):
    return numpy_helper.from_array(rng.standard_normal(shape).astype(dtype), name)


def _const(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "fuzz", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def conv_relu_pool():
    rng = np.random.default_rng(1)
    return _model([helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3],
                                    pads=[1, 1, 1, 1], strides=[1, 1]),
                   helper.make_node("Relu", ["c"], ["r"], name="relu"),
                   helper.make_node("MaxPool", ["r"], ["y"], name="pool", kernel_shape=[2, 2],
                                    strides=[2, 2])],
                  [_vi("x", [1, 2, 6, 6])], [_vi("y", [1, 4, 3, 3])],
                  [_init("w", rng, (4, 2, 3, 3)), _init("b", rng, (4,))])


def mlp():
    rng = np.random.default_rng(2)
    return _model([helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
                   helper.make_node("Relu", ["h"], ["r"], name="relu"),
                   helper.make_node("MatMul", ["r", "w2"], ["m"], name="fc2"),
                   helper.make_node("Add", ["m", "b2"], ["a"], name="bias"),
                   helper.make_node("Softmax", ["a"], ["y"], name="softmax", axis=-1)],
                  [_vi("x", [2, 8])], [_vi("y", [2, 4])],
                  [_init("w1", rng, (6, 8)), _init("b1", rng, (6,)), _init("w2", rng, (6, 4)),
                   _init("b2", rng, (4,))])


def data_movement():
    return _model([helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
                   helper.make_node("Transpose", ["r"], ["t"], name="transpose", perm=[0, 2, 1]),
                   helper.make_node("Concat", ["t", "t"], ["c"], name="concat", axis=1),
                   helper.make_node("Slice", ["c", "starts", "ends", "axes"], ["y"], name="slice")],
                  [_vi("x", [2, 12])], [_vi("y", [2, 4, 3])],
                  [_const("shape", [2, 3, 4]), _const("starts", [1]), _const("ends", [5]),
                   _const("axes", [1])])


def broadcasting():
    return _model([helper.make_node("Mul", ["x", "z"], ["m"], name="mul"),
                   helper.make_node("Sub", ["m", "c"], ["s"], name="sub"),
                   helper.make_node("Sigmoid", ["s"], ["y"], name="sigmoid")],
                  [_vi("x", [2, 3, 4]), _vi("z", [3, 1])], [_vi("y", [2, 3, 4])],
                  [numpy_helper.from_array(np.full((4,), 0.5, np.float32), "c")])


def pad_pool_reduce():
    return _model([helper.make_node("Pad", ["x", "pads"], ["p"], name="pad", mode="constant"),
                   helper.make_node("AveragePool", ["p"], ["a"], name="avgpool", kernel_shape=[2, 2]),
                   helper.make_node("ReduceMean", ["a"], ["m"], name="mean", axes=[2], keepdims=0),
                   helper.make_node("Gather", ["m", "idx"], ["y"], name="gather", axis=2)],
                  [_vi("x", [1, 3, 4, 5])], [_vi("y", [1, 3, 2])],
                  [_const("pads", [0, 0, 1, 1, 0, 0, 0, 0]), _const("idx", [0, 2])], opset=13)


def norm_block():
    """A conv block as exported: BatchNorm, Clip (ReLU6), global pool, flatten, a dense layer."""
    rng = np.random.default_rng(3)
    return _model([helper.make_node("Conv", ["x", "w"], ["c"], name="conv", kernel_shape=[1, 1]),
                   helper.make_node("BatchNormalization", ["c", "s", "bb", "mu", "var"], ["n"], name="bn",
                                    epsilon=1e-5),
                   helper.make_node("Clip", ["n", "lo", "hi"], ["r"], name="relu6"),
                   helper.make_node("GlobalAveragePool", ["r"], ["g"], name="gap"),
                   helper.make_node("Flatten", ["g"], ["f"], name="flatten", axis=1),
                   helper.make_node("Gemm", ["f", "wd", "bd"], ["y"], name="fc", transB=1)],
                  [_vi("x", [1, 3, 5, 5])], [_vi("y", [1, 2])],
                  [_init("w", rng, (4, 3, 1, 1)), _init("s", rng, (4,)), _init("bb", rng, (4,)),
                   _init("mu", rng, (4,)), numpy_helper.from_array(np.ones(4, np.float32), "var"),
                   numpy_helper.from_array(np.array(0, np.float32), "lo"),
                   numpy_helper.from_array(np.array(6, np.float32), "hi"),
                   _init("wd", rng, (2, 4)), _init("bd", rng, (2,))])


def select_split():
    """Split, Where, Cast, Expand, ReduceMax, LayerNormalization, Resize and TopK on tiny tensors."""
    return _model([helper.make_node("Split", ["x", "sizes"], ["a", "b"], name="split", axis=1),
                   helper.make_node("Greater", ["a", "b"], ["gt"], name="greater"),
                   helper.make_node("Where", ["gt", "a", "b"], ["w"], name="where"),
                   helper.make_node("Cast", ["gt"], ["gf"], name="cast", to=TensorProto.FLOAT),
                   helper.make_node("Add", ["w", "gf"], ["s"], name="add"),
                   helper.make_node("Expand", ["s", "eshape"], ["e"], name="expand"),
                   helper.make_node("LayerNormalization", ["e", "gamma"], ["ln"], name="ln", axis=-1),
                   helper.make_node("Resize", ["ln", "", "scales"], ["rs"], name="resize", mode="nearest"),
                   helper.make_node("ReduceMax", ["rs"], ["y"], name="max", axes=[1], keepdims=0),
                   helper.make_node("TopK", ["rs", "k"], ["tv", "ti"], name="topk", axis=-1)],
                  [_vi("x", [2, 4, 3])], [_vi("y", [2, 6]), _vi("tv", [2, 4, 2])],
                  [_const("sizes", [2, 2]), _const("eshape", [2, 2, 3]),
                   numpy_helper.from_array(np.ones(3, np.float32), "gamma"),
                   numpy_helper.from_array(np.array([1, 2, 2], np.float32), "scales"),
                   _const("k", [2])], opset=17)


BASES = {f.__name__: f for f in (conv_relu_pool, mlp, data_movement, broadcasting, pad_pool_reduce,
                                 norm_block, select_split)}


# ---- mutations ------------------------------------------------------------------------------------
# Each draws what it changes from `data`, edits the ModelProto `m` in place and returns a short
# description (the reproduction recipe printed for a bad outcome).

DIMS = [0, -1, -3, 1, 2, 3, 5, 7, 100000]
INTS = [-(2 ** 40), -7, -1, 0, 1, 2, 3, 5, 100000, 2 ** 62]
FLOATS = [float("nan"), float("inf"), -1.0, 0.0, 0.5, 1e30]
STRINGS = ["", "SAME_UPPER", "SAME_LOWER", "VALID", "NOTSET", "reflect", "edge", "garbage\n"]
ATTR_NAMES = ["kernel_shape", "strides", "pads", "dilations", "group", "axis", "axes", "perm",
              "transA", "transB", "alpha", "beta", "auto_pad", "ceil_mode", "keepdims", "to",
              "mode", "value", "allowzero", "storage_order", "count_include_pad", "epsilon",
              "split", "bogus"]
OPS = ["Relu", "Conv", "Gemm", "MatMul", "Add", "Softmax", "Reshape", "Transpose", "Concat", "Slice",
       "MaxPool", "AveragePool", "GlobalAveragePool", "Sigmoid", "Identity", "Flatten", "Squeeze",
       "Unsqueeze", "Gather", "Pad", "ReduceMean", "ReduceSum", "Cast", "Where", "Expand", "Split",
       "BatchNormalization", "LayerNormalization", "Clip", "Constant", "Shape", "Tile", "Resize",
       "ConvTranspose", "Einsum", "TopK", "Dense", "Fused", "NotAnOp"]
DTYPES = [TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT16, TensorProto.DOUBLE,
          TensorProto.BOOL, TensorProto.STRING, TensorProto.UINT8, TensorProto.INT8,
          TensorProto.BFLOAT16, TensorProto.COMPLEX64, TensorProto.UNDEFINED]


def _tensor_names(m):
    names = [i.name for i in m.graph.input] + [i.name for i in m.graph.initializer]
    for n in m.graph.node:
        names += [o for o in n.output if o]
    return names


def _attr_value(data, name):
    kind = data.draw(st.sampled_from(["int", "ints", "float", "floats", "string", "strings",
                                      "tensor", "empty_ints"]), label="attr kind")
    if kind == "int":
        return helper.make_attribute(name, data.draw(st.sampled_from(INTS), label="int"))
    if kind == "ints":
        return helper.make_attribute(name, data.draw(st.lists(st.sampled_from(INTS), min_size=1, max_size=9),
                                                     label="ints"))
    if kind == "float":
        return helper.make_attribute(name, data.draw(st.sampled_from(FLOATS), label="float"))
    if kind == "floats":
        return helper.make_attribute(name, data.draw(st.lists(st.sampled_from(FLOATS), min_size=1,
                                                              max_size=4), label="floats"))
    if kind == "string":
        return helper.make_attribute(name, data.draw(st.sampled_from(STRINGS), label="string"))
    if kind == "strings":
        return helper.make_attribute(name, data.draw(st.lists(st.sampled_from(STRINGS), min_size=1,
                                                               max_size=3), label="strings"))
    if kind == "tensor":
        shape = data.draw(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=3), label="tensor shape")
        dt = data.draw(st.sampled_from([np.float32, np.int64, np.bool_, np.float64]), label="tensor dtype")
        return helper.make_attribute(name, numpy_helper.from_array(np.ones(shape, dt)))
    return helper.make_attribute(name, [], attr_type=AttributeProto.INTS)


def _typed_value(data, name, typ):
    """A value of the attribute's declared type, drawn to be awkward (negative, huge, too long)."""
    A = AttributeProto
    if typ == A.INT:
        return helper.make_attribute(name, data.draw(st.sampled_from(INTS), label="int"))
    if typ == A.INTS:
        return helper.make_attribute(name, data.draw(st.lists(st.sampled_from(INTS), max_size=9),
                                                     label="ints"), attr_type=A.INTS)
    if typ == A.FLOAT:
        return helper.make_attribute(name, data.draw(st.sampled_from(FLOATS), label="float"))
    if typ == A.FLOATS:
        return helper.make_attribute(name, data.draw(st.lists(st.sampled_from(FLOATS), max_size=4),
                                                     label="floats"), attr_type=A.FLOATS)
    if typ == A.STRING:
        return helper.make_attribute(name, data.draw(st.sampled_from(STRINGS), label="string"))
    if typ == A.STRINGS:
        return helper.make_attribute(name, data.draw(st.lists(st.sampled_from(STRINGS), max_size=3),
                                                     label="strings"), attr_type=A.STRINGS)
    if typ == A.TENSOR:
        shape = data.draw(st.lists(st.sampled_from([0, 1, 2, 3]), max_size=3), label="tensor shape")
        dt = data.draw(st.sampled_from([np.float32, np.int64, np.bool_, np.float64]), label="tensor dtype")
        return helper.make_attribute(name, numpy_helper.from_array(np.ones(shape, dt)))
    return None


def _schema_attrs(node, m):
    opset = max([o.version for o in m.opset_import if o.domain in ("", "ai.onnx")] or [17])
    try:
        return dict(onnx.defs.get_schema(node.op_type, opset, "").attributes)
    except Exception:
        return {}


def mutate_attribute(m, data):
    node = data.draw(st.sampled_from(list(m.graph.node)), label="node")
    existing = [a.name for a in node.attribute]
    declared = _schema_attrs(node, m)
    action = data.draw(st.sampled_from(["plausible"] if DEEP else
                                       ["plausible", "plausible", "typed", "typed", "set", "remove", "add"]),
                       label="attr action")
    if action == "plausible" and declared:
        # small values of the declared type and the current length: mostly valid, other kernels
        name = data.draw(st.sampled_from(sorted(declared)), label="attr")
        typ = declared[name].type
        cur = next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)
        if typ == AttributeProto.INT:
            attr = helper.make_attribute(name, data.draw(st.sampled_from([-2, -1, 0, 1, 2, 3]), label="int"))
        elif typ == AttributeProto.INTS:
            n = len(cur) if isinstance(cur, list) and cur else data.draw(st.integers(1, 4), label="len")
            attr = helper.make_attribute(name, data.draw(st.lists(st.sampled_from([0, 1, 2, 3]), min_size=n,
                                                                  max_size=n), label="ints"))
        elif typ == AttributeProto.FLOAT:
            attr = helper.make_attribute(name, data.draw(st.sampled_from([0.0, 0.1, 1.0, 2.5]), label="float"))
        elif typ == AttributeProto.STRING:
            attr = helper.make_attribute(name, data.draw(st.sampled_from(
                ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID", "constant", "reflect", "edge", "wrap"]),
                label="string"))
        else:
            attr = None
        if attr is not None:
            keep = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend(keep + [attr])
            return f"{node.name}: attribute {name} = {helper.get_attribute_value(attr)!r}"
    if action == "typed" and declared:
        # a value of the right type: what the op's own checks must refuse, if it is wrong
        name = data.draw(st.sampled_from(sorted(declared)), label="attr")
        attr = _typed_value(data, name, declared[name].type)
        if attr is not None:
            keep = [a for a in node.attribute if a.name != name]
            del node.attribute[:]
            node.attribute.extend(keep + [attr])
            return f"{node.name}: attribute {name} = {helper.get_attribute_value(attr)!r}"
    if action == "remove" and existing:
        name = data.draw(st.sampled_from(existing), label="attr")
        keep = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend(keep)
        return f"{node.name}: remove attribute {name}"
    name = (data.draw(st.sampled_from(existing), label="attr") if action == "set" and existing
            else data.draw(st.sampled_from(ATTR_NAMES), label="attr"))
    attr = _attr_value(data, name)
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep + [attr])
    return f"{node.name}: attribute {name} = {helper.get_attribute_value(attr)!r}"


def mutate_node_inputs(m, data):
    node = data.draw(st.sampled_from(list(m.graph.node)), label="node")
    action = data.draw(st.sampled_from(["drop", "blank", "missing", "extra", "other"]), label="input action")
    ins = list(node.input)
    if action == "extra" or not ins:
        ins.append(data.draw(st.sampled_from(_tensor_names(m) + [""]), label="extra input"))
    else:
        j = data.draw(st.integers(0, len(ins) - 1), label="input index")
        if action == "drop":
            ins.pop(j)
        elif action == "blank":
            ins[j] = ""
        elif action == "missing":
            ins[j] = "no_such_tensor"
        else:
            ins[j] = data.draw(st.sampled_from(_tensor_names(m)), label="other input")
    del node.input[:]
    node.input.extend(ins)
    return f"{node.name}: inputs -> {ins}"


def mutate_structure(m, data):
    g = m.graph
    nodes = list(g.node)
    action = data.draw(st.sampled_from(["cycle", "reverse", "empty", "dup_node", "dup_output",
                                        "drop_node", "drop_graph_output", "bad_graph_output",
                                        "intermediate_output", "dup_graph_input", "input_is_init",
                                        "dup_initializer", "drop_output_of_node"]), label="structure")
    if action == "cycle":
        nodes[0].input[0] = nodes[-1].output[0]
    elif action == "reverse":
        del g.node[:]
        g.node.extend(reversed(nodes))
    elif action == "empty":
        del g.node[:]
    elif action == "dup_node":
        g.node.append(nodes[data.draw(st.integers(0, len(nodes) - 1), label="node")])
    elif action == "dup_output":
        i = data.draw(st.integers(0, len(nodes) - 1), label="node")
        nodes[i].output[0] = data.draw(st.sampled_from(_tensor_names(m)), label="name")
    elif action == "drop_node":
        i = data.draw(st.integers(0, len(nodes) - 1), label="node")
        del g.node[i]
    elif action == "drop_graph_output":
        del g.output[:]
    elif action == "bad_graph_output":
        g.output.append(_vi("nowhere", [1]))
    elif action == "intermediate_output":
        g.output.append(_vi(nodes[0].output[0], None))
    elif action == "dup_graph_input":
        g.input.append(g.input[0])
    elif action == "input_is_init":
        if g.initializer:
            vi = helper.make_tensor_value_info(g.initializer[0].name, F, [1, 2])
            g.input.append(vi)
    elif action == "dup_initializer":
        if g.initializer:
            g.initializer.append(g.initializer[0])
    elif action == "drop_output_of_node":
        i = data.draw(st.integers(0, len(nodes) - 1), label="node")
        nodes[i].output[0] = ""
    return f"structure: {action}"


def mutate_input_shape(m, data):
    inp = data.draw(st.sampled_from(list(m.graph.input)), label="input")
    tt = inp.type.tensor_type
    action = data.draw(st.sampled_from(["dim", "dim", "symbolic", "rank+", "rank-", "no_shape"]),
                       label="shape action")
    dims = tt.shape.dim
    if action == "no_shape":
        tt.ClearField("shape")
    elif action == "rank+":
        dims.add().dim_value = data.draw(st.sampled_from([1, 2, 3]), label="dim")
    elif action == "rank-" and len(dims):
        del dims[len(dims) - 1]
    elif len(dims):
        d = dims[data.draw(st.integers(0, len(dims) - 1), label="axis")]
        if action == "symbolic":
            d.dim_param = "N"
        else:
            d.dim_value = data.draw(st.sampled_from(DIMS), label="dim")
    dims = [(d.dim_param or d.dim_value) for d in tt.shape.dim] if tt.HasField('shape') else None
    return f"input {inp.name}: {action} -> {dims}"


def _cast(v, dtype):
    """`v` as an element of `dtype`, wrapped or saturated as C would store it."""
    with np.errstate(all="ignore"):
        return np.array(v, np.float64 if isinstance(v, float) else np.int64).astype(dtype)


def mutate_initializer(m, data):
    if not m.graph.initializer:
        return "initializer: none"
    i = data.draw(st.integers(0, len(m.graph.initializer) - 1), label="initializer")
    t = m.graph.initializer[i]
    try:
        a = numpy_helper.to_array(t)
    except Exception:                   # damaged by an earlier mutation
        return f"initializer {t.name}: left damaged"
    action = data.draw(st.sampled_from(["shape", "dtype", "values", "element", "element",
                                        "inconsistent", "scalar", "sparse", "external"]),
                       label="init action")
    if action == "sparse":       # the same values as a sparse initializer, indices maybe wrong
        flat = a.reshape(-1)
        idx = np.arange(flat.size, dtype=np.int64)
        if flat.size and data.draw(st.booleans(), label="bad index"):
            idx[-1] = data.draw(st.sampled_from([-1, flat.size, 2 ** 40]), label="index")
        sp = helper.make_sparse_tensor(numpy_helper.from_array(flat.copy(), t.name),
                                       numpy_helper.from_array(idx, ""), list(a.shape))
        del m.graph.initializer[i]
        m.graph.sparse_initializer.append(sp)
        return f"initializer {t.name}: sparse, indices {idx.tolist()[-3:]}"
    if action == "external":     # data said to live in a file: missing, or outside the model's folder
        loc = data.draw(st.sampled_from(["missing.bin", "../../etc/passwd", "/etc/passwd"]), label="location")
        t.ClearField("raw_data")
        t.ClearField("float_data")
        t.ClearField("int64_data")
        t.data_location = TensorProto.EXTERNAL
        t.external_data.add(key="location", value=loc)
        return f"initializer {t.name}: external data at {loc!r}"
    if action == "shape":
        shape = list(a.shape) or [1]
        j = data.draw(st.integers(0, len(shape) - 1), label="axis")
        shape[j] = data.draw(st.sampled_from([0, 1, 2, 3, 5, 9]), label="dim")
        if data.draw(st.booleans(), label="rank change"):
            shape.append(data.draw(st.sampled_from([1, 2]), label="dim"))
        b = np.resize(a, shape) if a.size else np.zeros(shape, a.dtype)
    elif action == "dtype":
        dt = data.draw(st.sampled_from([np.int32, np.int64, np.float16, np.float64, np.bool_, np.uint8,
                                        object]), label="dtype")
        b = a.astype(str).astype(object) if dt is object else a.astype(dt)
    elif action == "values":
        v = data.draw(st.sampled_from(INTS if a.dtype.kind in "iu" else FLOATS), label="value")
        b = np.full(a.shape, _cast(v, a.dtype), dtype=a.dtype)
    elif action == "element" and a.size:
        b = a.copy().reshape(-1)
        b[data.draw(st.integers(0, b.size - 1), label="index")] = _cast(data.draw(
            st.sampled_from(INTS if a.dtype.kind in "iu" else FLOATS), label="value"), a.dtype)
        b = b.reshape(a.shape)
    elif action == "scalar":
        b = np.asarray(a.reshape(-1)[:1].reshape(()) if a.size else np.zeros((), a.dtype))
    else:   # the declared dims disagree with the data
        nt = numpy_helper.from_array(a, t.name)
        nt.dims[:] = [data.draw(st.sampled_from([0, 7, 1000, -1]), label="dim")] + list(nt.dims)[1:]
        t.CopyFrom(nt)
        return f"initializer {t.name}: dims {list(nt.dims)} disagree with its data"
    t.CopyFrom(numpy_helper.from_array(b, t.name))
    return f"initializer {t.name}: {action} -> {b.dtype}{list(b.shape)}"


def mutate_dtype(m, data):
    where = data.draw(st.sampled_from(["input", "output"]), label="dtype of")
    vis = list(m.graph.input if where == "input" else m.graph.output)
    vi = data.draw(st.sampled_from(vis), label="value info")
    dt = data.draw(st.sampled_from(DTYPES), label="dtype")
    vi.type.tensor_type.elem_type = dt
    return f"{where} {vi.name}: dtype {TensorProto.DataType.Name(dt)}"


SIMILAR = [["Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "Log", "Sqrt", "Reciprocal", "Floor",
            "Softplus", "Elu", "Selu", "HardSigmoid", "LeakyRelu", "Erf", "Sin", "Identity", "Softmax",
            "LogSoftmax", "Not", "Sign", "Round", "Ceil", "Mish", "HardSwish"],
           ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "Equal", "Greater", "Less",
            "PRelu", "And", "BitShift", "Sum", "Mean"],
           ["MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool"],
           ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2",
            "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin"],
           ["Gemm", "MatMul", "Conv", "ConvTranspose"]]


def mutate_retype(m, data):
    """The whole model in another element type (every float tensor): valid where the ops take it."""
    dt = data.draw(st.sampled_from([TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32,
                                    TensorProto.INT64, TensorProto.INT8, TensorProto.UINT8,
                                    TensorProto.BOOL]), label="model dtype")
    np_dt = helper.tensor_dtype_to_np_dtype(dt)
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == F:
            vi.type.tensor_type.elem_type = dt
    for t in m.graph.initializer:
        if t.data_type == F:
            try:
                a = numpy_helper.to_array(t)
            except Exception:     # damaged by an earlier mutation
                continue
            t.CopyFrom(numpy_helper.from_array(np.clip(a * 3, -100, 100).astype(np_dt), t.name))
    return f"model retyped to {TensorProto.DataType.Name(dt)}"


def mutate_op_type(m, data):
    node = data.draw(st.sampled_from(list(m.graph.node)), label="node")
    family = next((f for f in SIMILAR if node.op_type in f), None)
    if family and (DEEP or data.draw(st.integers(0, 2), label="similar") > 0):
        op = data.draw(st.sampled_from(family), label="op")     # an op that could fit its place
        keep = [a for a in node.attribute if a.name in _schema_attrs(helper.make_node(op, [], []), m)]
        del node.attribute[:]
        node.attribute.extend(keep)
    else:
        op = data.draw(st.sampled_from(OPS), label="op")
    old, node.op_type = node.op_type, op
    return f"{node.name}: op {old} -> {node.op_type}"


def mutate_opset(m, data):
    action = data.draw(st.sampled_from(["version", "drop", "domain", "ir_version"]), label="opset action")
    if action == "version":
        if not m.opset_import:
            m.opset_import.append(helper.make_opsetid("", 17))
        m.opset_import[0].version = data.draw(st.sampled_from([1, 5, 6, 7, 9, 10, 11, 12, 13, 99]),
                                              label="version")
    elif action == "drop":
        del m.opset_import[:]
    elif action == "domain" and m.graph.node:
        node = data.draw(st.sampled_from(list(m.graph.node)), label="node")
        node.domain = "com.example"
    elif action == "ir_version":
        m.ir_version = data.draw(st.sampled_from([0, 1, 3, 99]), label="ir version")
    return f"opset: {action}"


MUTATIONS = [mutate_attribute, mutate_attribute, mutate_attribute, mutate_node_inputs, mutate_structure,
             mutate_input_shape, mutate_input_shape, mutate_initializer, mutate_dtype, mutate_op_type,
             mutate_op_type, mutate_opset, mutate_retype]


DEEP_MUTATIONS = [mutate_attribute, mutate_op_type, mutate_retype]


def draw_case(data) -> dict:
    """A mutated model as the worker takes it, with the recipe that made it."""
    base = data.draw(st.sampled_from(sorted(BASES)), label="base")
    m = BASES[base]()
    recipe = [base]
    if data.draw(st.booleans(), label="outputs undeclared"):
        for out in m.graph.output:       # as many exporters write them: no shape to contradict
            out.type.tensor_type.ClearField("shape")
        recipe.append("output shapes undeclared")
    for _ in range(data.draw(st.sampled_from([0, 1, 1, 1, 2, 3]), label="n mutations")):
        mut = data.draw(st.sampled_from(DEEP_MUTATIONS if DEEP else MUTATIONS), label="mutation")
        if mut in (mutate_attribute, mutate_node_inputs, mutate_op_type) and not m.graph.node:
            continue
        if mut is mutate_input_shape and not m.graph.input:
            continue
        if mut is mutate_dtype and not (m.graph.input and m.graph.output):
            continue
        if mut is mutate_structure and not m.graph.node:
            continue
        recipe.append(mut(m, data))
    shape = None
    if data.draw(st.integers(0, 3), label="override?") == 0 and m.graph.input:
        # a dynamic dimension bound by shape= (before any byte damage: see below)
        inp = data.draw(st.sampled_from(list(m.graph.input)), label="input")
        tdims = inp.type.tensor_type.shape.dim
        dims = [d.dim_value or 1 for d in tdims]
        if dims:
            j = data.draw(st.integers(0, len(dims) - 1), label="axis")
            if data.draw(st.integers(0, 4), label="make dynamic") > 0:
                tdims[j].dim_param = "N"
            dims[j] = data.draw(st.sampled_from(DIMS), label="dim")
        shape = {data.draw(st.sampled_from([inp.name] * 5 + ["nope"]), label="name"): dims}
        recipe.append(f"shape={shape}")
    payload = m.SerializeToString()
    damage = data.draw(st.sampled_from(["none"] if DEEP else ["none"] * 8 + ["truncate", "flip"]),
                       label="bytes")
    if damage == "truncate":
        n = data.draw(st.integers(0, len(payload) - 1), label="length")
        payload = payload[:n]
        recipe.append(f"truncated to {n} of {len(m.SerializeToString())} bytes")
    elif damage == "flip":
        i = data.draw(st.integers(0, len(payload) - 1), label="offset")
        payload = payload[:i] + bytes([payload[i] ^ 0xFF]) + payload[i + 1:]
        recipe.append(f"byte {i} flipped")
    form = data.draw(st.sampled_from(["bytes", "bytes", "proto", "path"]), label="form")
    feeds = data.draw(st.sampled_from(["declared"] * 9 + ["wrong"]), label="feeds")
    return {"payload": payload, "shape": shape, "form": form, "feeds": feeds, "recipe": recipe}


# ---- the worker process -----------------------------------------------------------------------------

def _feeds(module, mode, rng):
    feeds = {}
    for spec in module.input_specs:
        shape, dtype = tuple(spec["shape"]), np.dtype(spec["dtype"])
        if dtype.kind == "f":
            x = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            x = rng.random(shape) < 0.5
        else:
            x = rng.integers(0, 3, shape).astype(dtype)
        feeds[spec["name"]] = x
    if mode == "wrong" and feeds:
        name = next(iter(feeds))
        feeds[name] = feeds[name].reshape(-1)[:-1] if feeds[name].size else np.zeros(3, np.int8)
    return feeds


def _case(case, tmpdir):
    """One case through from_onnx, compile and run: ('ok'|'modelc'|'raw', stage, type, message)."""
    import warnings

    import modelc
    from modelc.errors import ModelcError

    warnings.simplefilter("ignore")
    stage = "from_onnx"
    try:
        model = case["payload"]
        if case["form"] == "path":
            model = os.path.join(tmpdir, "case.onnx")
            with open(model, "wb") as f:
                f.write(case["payload"])
        elif case["form"] == "proto":
            try:
                model = onnx.load_from_string(case["payload"])
            except Exception:
                pass        # unparseable: give modelc the bytes
        graph = modelc.from_onnx(model, shape=case["shape"])
        stage = "compile"
        module = modelc.compile(graph)
        stage = "run"
        feeds = _feeds(module, case["feeds"], np.random.default_rng(0))
        out = module.run(feeds)
        if not isinstance(out, dict):
            return ("raw", stage, "TypeError", f"run returned {type(out).__name__}, not a dict")
        return ("ok", stage, *_against_onnxruntime(case["payload"], feeds, out))
    except ModelcError as e:
        return ("modelc", stage, type(e).__name__, str(e))
    except BaseException as e:   # noqa: BLE001  (what the test is looking for)
        return ("raw", stage, type(e).__name__, "".join(traceback.format_exception(e))[-3000:])


def _against_onnxruntime(payload, feeds, out):
    """A model modelc runs is run by onnxruntime too: ('agrees' | 'onnxruntime refuses' |
    'differs', detail). Differing results are a wrong answer, as bad as a crash."""
    import onnxruntime as ort
    try:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        opts.log_severity_level = 4
        sess = ort.InferenceSession(payload, opts, providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        expected = dict(zip(names, sess.run(None, feeds)))
    except Exception as e:
        return "onnxruntime refuses", str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    for name, want in expected.items():
        got = out.get(name)
        want = np.asarray(want)
        if got is None or got.shape != want.shape or got.dtype != want.dtype:
            return "differs", (f"output {name!r}: modelc {None if got is None else (got.dtype, got.shape)}"
                               f", onnxruntime {(want.dtype, want.shape)}")
        if want.dtype.kind == "f":
            tol = 5e-2 if want.dtype.itemsize < 4 else 1e-4     # float16: a few ulps of 30
            fin = np.isfinite(want)
            scale = float(np.abs(want[fin]).max()) if fin.any() else 1.0
            bad = ~np.isclose(got, want, rtol=tol, atol=tol * max(scale, 1.0), equal_nan=True)
        else:
            bad = got != want
        if bad.any():
            g, w = got[bad].astype(np.float64), want[bad].astype(np.float64)
            if not (np.isfinite(g) & np.isfinite(w)).any():
                # a NaN or inf weight (the fuzzer writes some): IEEE corner cases (0 * inf in a
                # padded window, NaN through a max) that kernels built with fast-math need not
                # share with onnxruntime; tallied, not failed
                return "non-finite values differ", f"output {name!r}: {int(bad.sum())} element(s)"
            return "differs", (f"output {name!r}: {int(bad.sum())} of {bad.size} element(s) differ, "
                               f"max abs difference {np.nanmax(np.abs(g - w)):.3g}")
    return "agrees", ""


def _serve(conn):
    import resource
    import tempfile
    try:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    except (ValueError, OSError):
        pass
    import modelc  # noqa: F401  (import once, before the first case's clock starts)
    conn.send("ready")
    with tempfile.TemporaryDirectory() as tmpdir:
        while True:
            case = conn.recv()
            if case is None:
                return
            conn.send(_case(case, tmpdir))


class Worker:
    """A spawned process that runs cases; restarted after a crash or a timeout."""

    def __init__(self):
        self.ctx = multiprocessing.get_context("spawn")
        self.proc = None
        self.restarts = 0

    def _start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_serve, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        if not self.conn.poll(120) or self.conn.recv() != "ready":
            raise RuntimeError("the fuzz worker did not start")

    def _stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.join()
            self.proc = None
            self.restarts += 1

    def run(self, case):
        if self.proc is None:
            self._start()
        self.conn.send(case)
        try:
            if self.conn.poll(TIMEOUT):
                return self.conn.recv()
        except (EOFError, OSError):       # the worker died (segfault, abort, os._exit)
            self.proc.join(10)
            code = self.proc.exitcode
            self._stop()
            return ("crash", "?", f"exit code {code}", "the worker process died")
        self._stop()
        return ("hang", "?", "timeout", f"no outcome after {TIMEOUT:.0f} s")

    def close(self):
        if self.proc is not None:
            try:
                self.conn.send(None)
                self.proc.join(10)
            except OSError:
                pass
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
            self.proc = None


# ---- judging outcomes -------------------------------------------------------------------------------

# a message that is only another library's text: "index 3 is out of bounds", "'x'", ...
RAW_TEXT = re.compile(r"Traceback \(most recent call last\)|^\s*'[^']*'\s*$|^\s*$")
# a wrapped foreign exception: the shape rules of modelc's ops raise ValueError with their own
# message, which the registry prefixes with the node ("node 'fc' (Gemm): ...: ValueError: Gemm
# operands must be 2-D"); those are tallied. A wrapped Python error (a TypeError from calling a rule
# with an attribute it does not take, an AttributeError on a missing input ...) is a bug: the model
# should have been refused, with its own message, before the rule ran.
WRAPPED = re.compile(r"\b(?:[A-Z]\w*Error|Exception|numba\.\w+)\b: ")
INTERNAL = re.compile(r"\b(?:TypeError|AttributeError|KeyError|IndexError|NameError|UnboundLocalError|"
                      r"AssertionError|RecursionError|ZeroDivisionError|OverflowError|MemoryError|"
                      r"UnicodeDecodeError|NotImplementedError|SystemError|LoweringError|TypingError)\b")


def judge(outcome):
    """(kind for the tally, problem or None)."""
    status, stage, typ, msg = outcome
    if status == "ok":
        if typ == "differs":
            return "success, but differs from onnxruntime", f"wrong result: {msg}"
        return f"success ({typ}{' from onnxruntime' if typ.endswith('differ') else ''})", None
    if status != "modelc":
        return f"{status}: {typ} in {stage}", f"{status} ({typ}) in {stage}:\n{msg}"
    kind = f"{typ} in {stage}"
    if RAW_TEXT.search(msg):
        return kind, f"{typ} with a raw message: {msg[:300]!r}"
    limit = 1200 if typ == "UnsupportedOpError" else 500
    if len(msg) > limit or (typ != "UnsupportedOpError" and msg.count("\n") > 3):
        return kind, f"{typ} with a {len(msg)}-character, {msg.count(chr(10)) + 1}-line message: {msg[:300]!r}"
    if INTERNAL.search(msg):
        return kind, f"{typ} wraps an internal error: {msg[:400]!r}"
    if WRAPPED.search(msg):
        kind += " (wraps a foreign error)"
    return kind, None


def test_fuzz_mutated_models(capsys):
    tally = collections.Counter()
    problems = []
    worker = Worker()
    start = time.perf_counter()

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=SEED is None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @seed(SEED or 0)
    @given(st.data())
    def one(data):
        case = draw_case(data)
        outcome = worker.run(case)
        kind, problem = judge(outcome)
        tally[kind] += 1
        if VERBOSE:
            print(f"{' | '.join(case['recipe'])}\n    -> {kind}: {outcome[3][:400]}", flush=True)
        if problem:
            problems.append(f"{' | '.join(case['recipe'])}\n    -> {problem}")

    try:
        one()
    finally:
        worker.close()
    elapsed = time.perf_counter() - start
    with capsys.disabled():
        print(f"\nfuzz: {sum(tally.values())} examples in {elapsed:.0f} s, "
              f"{worker.restarts} worker restart(s); outcomes by kind:")
        for kind, n in tally.most_common():
            print(f"  {n:5d}  {kind}")
        for p in problems:
            print(f"  PROBLEM: {p}")
    assert not problems, f"{len(problems)} bad outcome(s):\n" + "\n".join(problems)


# ---- what the fuzzing found, one case each ----------------------------------------------------------

def _import_error(m, **kw):
    import modelc
    from modelc.errors import ModelcError
    try:
        modelc.from_onnx(m, **kw)
    except ModelcError as e:
        return type(e).__name__, str(e)
    return None


def test_found_attributes_are_checked_against_the_schema():
    m = conv_relu_pool()
    m.graph.node[2].attribute.append(helper.make_attribute("strides", 2.0))   # a float, not ints
    del m.graph.node[2].attribute[1]                                           # (the ints strides)
    assert _import_error(m) == ("ModelLoadError", "node 'pool' (MaxPool): attribute 'strides' is of "
                                                  "type FLOAT, expected INTS")
    m = broadcasting()
    m.graph.node[0].attribute.append(helper.make_attribute("kernel_shape", [3]))
    kind, msg = _import_error(m)
    assert kind == "ModelLoadError" and "'kernel_shape', which Mul" in msg
    m = mlp()
    m.graph.node[0].input.append("x")                  # Gemm with four inputs
    assert _import_error(m)[1] == "node 'fc1' (Gemm) has 4 inputs; Gemm takes at most 3"
    m = data_movement()
    m.graph.node[1].input[0] = ""                      # Transpose without its input
    assert "lacks its required input 0" in _import_error(m)[1]


def test_negative_pads_are_refused_naming_the_node():
    """onnxruntime refuses them; a conv would otherwise compile to a kernel of another shape."""
    m = conv_relu_pool()
    conv = m.graph.node[0]
    pads = next(a for a in conv.attribute if a.name == "pads")
    pads.ints[0] = -1
    kind, msg = _import_error(m)
    assert kind == "ShapeError" and "node 'conv' (Conv)" in msg and "must not be negative" in msg, msg


def test_found_element_types_must_agree():
    m = broadcasting()
    m.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.full((4,), 1, np.int32), "c"))
    kind, msg = _import_error(m)
    assert kind == "ModelLoadError" and "node 'sub' (Sub): inputs 0 ('m') and 1 ('c')" in msg
    m = broadcasting()
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.STRING
    assert "element type STRING" in _import_error(m)[1]


def test_found_malformed_protos_are_load_errors():
    m = mlp()
    data = m.SerializeToString()
    kind, msg = _import_error(data[:2])               # parses as an empty model
    assert kind == "ModelLoadError" and "no ONNX graph" in msg
    t = m.graph.initializer[0]
    t.dims[0] = 1000                                   # dims disagree with the data
    kind, msg = _import_error(m)
    assert kind == "ModelLoadError" and "initializer 'w1'" in msg


def test_found_shapes_zero_and_negative_dims():
    m = mlp()
    for out in m.graph.output:
        out.type.tensor_type.ClearField("shape")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    import modelc
    g = modelc.from_onnx(m)                            # a zero-size batch, as onnxruntime runs it
    assert g.tensors["y"].shape == (0, 4)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    kind, msg = _import_error(m)
    assert kind == "ShapeError" and "declares shape [-1, 8] with a negative dimension" in msg


def test_found_constant_indices_and_slice_parameters_are_checked_at_import():
    m = pad_pool_reduce()
    m.graph.initializer[1].CopyFrom(_const("idx", [0, 7]))
    kind, msg = _import_error(m)
    assert kind == "ShapeError" and "node 'gather' (Gather)" in msg and "index 7 is out of range" in msg
    m = data_movement()
    m.graph.initializer[3].CopyFrom(numpy_helper.from_array(np.array(1, np.int64), "axes"))
    kind, msg = _import_error(m)
    assert kind == "ShapeError" and "axes must be a 1-D tensor" in msg
    m = conv_relu_pool()
    m.graph.node[0].attribute.append(helper.make_attribute("dilations", [], attr_type=AttributeProto.INTS))
    import modelc
    assert "dilations" not in modelc.from_onnx(m).node("conv").attrs    # empty = the default


def test_found_gather_with_run_time_indices_never_reads_outside_its_input():
    """An index input out of range made the generated kernel read past the buffer (a segfault
    for a large index); it is clipped, as TVM's take does by default."""
    import modelc
    m = _model([helper.make_node("Gather", ["d", "i"], ["g"], axis=0),
                helper.make_node("Relu", ["g"], ["y"])],
               [_vi("d", [5]), _vi("i", [3], TensorProto.INT64)], [_vi("y", [3])])
    mod = modelc.compile(m)
    d = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(mod.run({"d": d, "i": np.array([4, -1, 0])})["y"], [4, 4, 0])
    np.testing.assert_array_equal(mod.run({"d": d, "i": np.array([10 ** 12, -10 ** 12, 7])})["y"],
                                  [4, 0, 4])


def test_found_declared_output_type_must_match():
    m = conv_relu_pool()
    m.graph.output[0].type.tensor_type.elem_type = TensorProto.DOUBLE   # the model computes float
    kind, msg = _import_error(m)
    assert kind == "ModelLoadError" and "graph output 'y'" in msg and "DOUBLE" in msg


def test_found_empty_tensors_need_no_kernel():
    """A batch of 0 reached the pool template, whose space has no candidates for 0 planes."""
    import modelc
    m = norm_block()
    m.graph.output[0].type.tensor_type.ClearField("shape")
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    mod = modelc.compile(m)
    assert mod.run({"x": np.zeros((0, 3, 5, 5), np.float32)})["y"].shape == (0, 2)


def test_found_initializer_listed_as_input_must_match_its_declaration():
    m = broadcasting()
    m.graph.input.append(_vi("c", [0, 2]))
    kind, msg = _import_error(m)
    assert kind == "ModelLoadError" and "initializer 'c' has shape [4]" in msg


def test_found_flag_attributes_are_0_or_1_and_resize_scales_finite():
    m = select_split()
    m.graph.node[-1].attribute.append(helper.make_attribute("largest", -1))   # onnxruntime: smallest
    assert _import_error(m) == ("ModelLoadError", "node 'topk' (TopK): attribute 'largest' = -1, "
                                                  "expected 0 or 1")
    m = select_split()
    m.graph.initializer[3].CopyFrom(numpy_helper.from_array(np.array([1, 2, np.inf], np.float32),
                                                            "scales"))
    kind, msg = _import_error(m)
    assert kind == "ShapeError" and "must be finite and positive" in msg


def test_found_resize_modes_are_checked_at_import():
    m = select_split()
    m.graph.node[7].attribute.append(helper.make_attribute("coordinate_transformation_mode", "SAME_UPPER"))
    kind, msg = _import_error(m)
    assert kind == "ShapeError" and "node 'resize' (Resize)" in msg and "'SAME_UPPER' is not one of" in msg


def test_found_absurd_sizes_are_shape_errors_at_import():
    m = pad_pool_reduce()
    for out in m.graph.output:
        out.type.tensor_type.ClearField("shape")
    m.graph.initializer[0].CopyFrom(_const("pads", [0, 0, 1, 1, 0, 0, 0, 2 ** 50]))
    kind, msg = _import_error(m)
    assert kind == "ShapeError" and "node 'pad' (Pad): output 'p'" in msg and "more elements" in msg
    assert _import_error(pad_pool_reduce(), shape={"x": "1,3,4,5"})[0] == "ShapeError"


def test_found_layer_norm_scale_must_fit_the_normalized_shape():
    m = select_split()
    m.graph.initializer[2].CopyFrom(numpy_helper.from_array(np.ones(2, np.float32), "gamma"))
    kind, msg = _import_error(m)
    assert kind == "ShapeError" and "node 'ln' (LayerNormalization)" in msg and "scale [2]" in msg


def test_found_element_types_are_checked_in_old_opsets_too():
    """Not-1 takes bool only; an int32 input ran and its kernel wrote bool where int32 was planned."""
    m = _model([helper.make_node("Not", ["x"], ["y"], name="not")], [_vi("x", [2], TensorProto.INT32)],
               [_vi("y", [2], TensorProto.BOOL)], opset=5)
    kind, msg = _import_error(m)
    assert kind == "ModelLoadError" and "node 'not' (Not): input 0 ('x') is tensor(int32)" in msg
