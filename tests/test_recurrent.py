"""RNN, GRU and LSTM (frontend/recurrent.py), compiled, against onnxruntime's own kernels: every
direction, layout, optional input and gate option, float32 layers as one RecurrentSteps kernel
(kernels/recurrent.py), others (float64) written out step by step."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import modelc
from modelc.errors import ModelcError
from workloads import onnx_model

pytestmark = pytest.mark.filterwarnings("ignore:onnx.checker rejects")
RNG = np.random.default_rng(0)
F = TensorProto.FLOAT
S, B, IN, H = 5, 3, 4, 6


def _model(op, attrs, consts, data, outputs, opset=14):
    """`consts` become initializers (weights), `data` graph inputs; '' leaves an input out."""
    names = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"]
    given = {**consts, **data}
    last = max(i for i, n in enumerate(names) if n in given)
    ins = [n if n in given else "" for n in names[:last + 1]]
    node = helper.make_node(op, ins, outputs, **attrs)
    inputs = [helper.make_tensor_value_info(k, TensorProto.INT32 if v.dtype == np.int32 else F, list(v.shape))
              for k, v in data.items()]
    outs = [helper.make_tensor_value_info(o, F, None) for o in outputs if o]
    return onnx_model([node], inputs, outs, [numpy_helper.from_array(v, k) for k, v in consts.items()], opset,
                      ir_version=8)


def _check(m, feeds):
    """Against onnxruntime; batch-first layouts (which it refuses) against ONNX's reference."""
    mod = modelc.compile(m)
    assert not mod.fallbacks, mod.fallbacks
    got = mod.run(feeds)
    if any(a.name == "layout" and a.i for a in m.graph.node[0].attribute):
        want = ReferenceEvaluator(m).run(None, feeds)
    else:
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for o, w in zip(m.graph.output, want):
        scale = float(np.abs(w).max()) or 1.0
        np.testing.assert_allclose(got[o.name], w, rtol=0, atol=2e-6 * scale + 1e-7, err_msg=o.name)
    assert not {"LSTM", "GRU", "RNN"} & set(modelc.from_onnx(m).op_counts())


def _w(*shape):
    return (RNG.standard_normal(shape) * 0.5).astype(np.float32)


def _x(layout=0):
    return _w(B, S, IN) if layout else _w(S, B, IN)


@pytest.mark.parametrize("direction,layout", [("forward", 0), ("reverse", 0), ("bidirectional", 1)])
def test_lstm_with_peepholes_initial_states_and_every_output(direction, layout):
    d = 2 if direction == "bidirectional" else 1
    hs = (B, d, H) if layout else (d, B, H)
    consts = {"W": _w(d, 4 * H, IN), "R": _w(d, 4 * H, H), "B": _w(d, 8 * H), "P": _w(d, 3 * H)}
    data = {"X": _x(layout), "initial_h": _w(*hs), "initial_c": _w(*hs)}
    m = _model("LSTM", {"hidden_size": H, "direction": direction, "layout": layout}, consts, data,
               ["Y", "Y_h", "Y_c"])
    _check(m, data)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lengths_given_as_data_mask_each_entry(direction):
    """Lengths 5, 2 and 0 of 5 steps: states stop at each entry's end, outputs past it are zeros,
    and the reverse direction starts from each entry's own last step."""
    d = 2 if direction == "bidirectional" else 1
    for op, g in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
        consts = {"W": _w(d, g * H, IN), "R": _w(d, g * H, H), "B": _w(d, 2 * g * H)}
        data = {"X": _x(), "sequence_lens": np.array([5, 2, 0], np.int32), "initial_h": _w(d, B, H)}
        m = _model(op, {"hidden_size": H, "direction": direction}, consts, data, ["Y", "Y_h"])
        _check(m, data)


@pytest.mark.parametrize("lbr", [0, 1])
def test_gru_reset_before_or_after_the_product(lbr):
    consts = {"W": _w(1, 3 * H, IN), "R": _w(1, 3 * H, H), "B": _w(1, 6 * H)}
    data = {"X": _x()}
    m = _model("GRU", {"hidden_size": H, "linear_before_reset": lbr}, consts, data, ["Y", "Y_h"])
    _check(m, data)


@pytest.mark.parametrize("op,attrs", [("LSTM", {"direction": "bidirectional"}),
                                      ("GRU", {"linear_before_reset": 1, "direction": "reverse"}),
                                      ("GRU", {"linear_before_reset": 0, "direction": "bidirectional"}),
                                      ("RNN", {})])
def test_default_layers_run_their_steps_in_one_kernel(op, attrs):
    """Default activations, no clip, peepholes or sequence lengths (what PyTorch exports): the
    layer's time loop, both directions of a bidirectional one, is one RecurrentSteps op on the
    recurrent_steps template, with initial states and every output, and agrees with onnxruntime."""
    from modelc.extract import extract_tasks
    d = 2 if attrs.get("direction") == "bidirectional" else 1
    g = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    consts = {"W": _w(d, g * H, IN), "R": _w(d, g * H, H), "B": _w(d, 2 * g * H)}
    data = {"X": _x(), "initial_h": _w(d, B, H), **({"initial_c": _w(d, B, H)} if op == "LSTM" else {})}
    m = _model(op, {"hidden_size": H, **attrs}, consts, data, ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else []))
    _check(m, data)
    assert modelc.from_onnx(m).op_counts().get("RecurrentSteps") == 1          # its directions side by side
    assert [t.template for t in extract_tasks(m)].count("recurrent_steps") == 1


def test_a_sequence_longer_than_unrolling_allows_runs_as_one_kernel():
    """3,000 steps of an LSTM would be 66,000 written-out nodes, past the limit; as one kernel it
    compiles and agrees with onnxruntime (only the last state is an output here)."""
    steps = 3000
    consts = {"W": _w(1, 4 * H, IN), "R": _w(1, 4 * H, H) * 0.5, "B": _w(1, 8 * H)}
    data = {"X": _w(steps, 1, IN)}
    m = _model("LSTM", {"hidden_size": H}, consts, data, ["", "Y_h"])
    _check(m, data)


def test_activations_with_parameters_clip_and_coupled_gates():
    """LeakyRelu and HardSigmoid take activation_alpha/beta in the order they are listed; clip bounds
    every gate's input; input_forget couples the forget gate to the input gate."""
    consts = {"W": _w(1, 4 * H, IN) * 4, "R": _w(1, 4 * H, H) * 4}
    data = {"X": _x()}
    m = _model("LSTM", {"hidden_size": H, "clip": 1.5, "input_forget": 1,
                        "activations": ["HardSigmoid", "LeakyRelu", "Tanh"],
                        "activation_alpha": [0.3, 0.2], "activation_beta": [0.4]}, consts, data, ["Y", "Y_h"])
    _check(m, data)
    assert modelc.from_onnx(m).op_counts().get("RecurrentSteps") == 1
    m = _model("RNN", {"hidden_size": H, "activations": ["Relu"]}, {"W": _w(1, H, IN), "R": _w(1, H, H)},
               data, ["", "Y_h"])
    _check(m, data)
    assert modelc.from_onnx(m).op_counts().get("RecurrentSteps") == 1


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_every_option_at_once_is_one_kernel(op):
    """Each direction its own activations (with alpha and beta), clip, sequence lengths as data,
    peepholes and initial states: one RecurrentSteps op on the recurrent_steps template."""
    from modelc.extract import extract_tasks
    g, n = {"LSTM": (4, 3), "GRU": (3, 2), "RNN": (1, 1)}[op]
    acts = {"LSTM": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Softsign", "ScaledTanh"],
            "GRU": ["HardSigmoid", "Elu", "Sigmoid", "Affine"], "RNN": ["LeakyRelu", "Softplus"]}[op]
    alpha = {"LSTM": [0.3, 0.7], "GRU": [0.25, 0.9, 0.5], "RNN": [0.2]}[op]
    beta = {"LSTM": [0.45, 1.3], "GRU": [0.55, 0.1], "RNN": []}[op]
    consts = {"W": _w(2, g * H, IN) * 3, "R": _w(2, g * H, H), "B": _w(2, 2 * g * H),
              **({"P": _w(2, 3 * H)} if op == "LSTM" else {})}
    data = {"X": _x(), "sequence_lens": np.array([4, 5, 0], np.int32), "initial_h": _w(2, B, H),
            **({"initial_c": _w(2, B, H)} if op == "LSTM" else {})}
    attrs = {"hidden_size": H, "direction": "bidirectional", "clip": 1.25, "activations": acts,
             "activation_alpha": alpha, **({"activation_beta": beta} if beta else {}),
             **({"linear_before_reset": 1} if op == "GRU" else {})}
    m = _model(op, attrs, consts, data, ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else []))
    _check(m, data)
    assert [t.template for t in extract_tasks(m)].count("recurrent_steps") == 1


def test_float64_layers_are_written_out_step_by_step():
    """Against onnxruntime on the float32 layer (it has no float64 GRU), at float32's precision:
    the reverse direction with sequence lengths, the written-out path's hardest case."""
    x = _x()
    consts = {"W": _w(1, 3 * H, IN), "R": _w(1, 3 * H, H), "sequence_lens": np.array([5, 2, 1], np.int32)}

    def model(t, dt):
        node = helper.make_node("GRU", ["X", "W", "R", "", "sequence_lens"], ["Y", "Y_h"], hidden_size=H,
                                direction="reverse")
        return onnx_model([node], [helper.make_tensor_value_info("X", t, list(x.shape))],
                          [helper.make_tensor_value_info(o, t, None) for o in ("Y", "Y_h")],
                          [numpy_helper.from_array(v if v.dtype == np.int32 else v.astype(dt), k)
                           for k, v in consts.items()], 14, ir_version=8)
    m = model(TensorProto.DOUBLE, np.float64)
    assert "RecurrentSteps" not in modelc.from_onnx(m).op_counts()
    got = modelc.compile(m).run({"X": x.astype(np.float64)})
    want = ort.InferenceSession(model(F, np.float32).SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, {"X": x})
    for o, w in zip(("Y", "Y_h"), want):
        np.testing.assert_allclose(got[o], w, rtol=0, atol=2e-6 * float(np.abs(w).max()))


def test_a_recurrent_layer_with_weights_of_the_wrong_shape_is_named():
    consts = {"W": _w(1, 4 * H, IN + 1), "R": _w(1, 4 * H, H)}
    m = _model("LSTM", {"hidden_size": H}, consts, {"X": _x()}, ["Y"])
    m.graph.node[0].name = "encoder_lstm"
    with pytest.raises(ModelcError, match="encoder_lstm.*W 'W' has shape"):
        modelc.from_onnx(m)
    m = _model("LSTM", {"hidden_size": H}, {"W": _w(1, 4 * H, IN), "R": _w(1, 4 * H, H),
                                          "sequence_lens": np.array([9, 2, 1], np.int32)}, {"X": _x()}, ["Y"])
    with pytest.raises(ModelcError, match=r"sequence_lens \[9, 2, 1\] must lie in \[0, 5\]"):
        modelc.from_onnx(m)
    m = _model("RNN", {"hidden_size": 0}, {"W": np.zeros((1, 0, IN), np.float32), "R": np.zeros((1, 0, 0), np.float32)},
               {"X": _x()}, ["Y"])
    with pytest.raises(ModelcError, match="hidden_size 0 is not a positive"):
        modelc.from_onnx(m)


@pytest.mark.parametrize("attr,value", [("direction", "sideways"), ("direction", 7), ("kind", "LSTMX"),
                                        ("linear_before_reset", 2), ("activations", ["exec", "tanh"]),
                                        ("activations", ["sigmoid"]), ("activation_alpha", ["nan", 0.0]),
                                        ("clip", "inf"), ("clip", -1.0), ("input_forget", 1), ("peep", 1)])
def test_a_crafted_recurrent_steps_workload_is_refused_by_name(attr, value):
    """A tuning log or saved module is untrusted: a RecurrentSteps op with attributes modelc never
    makes is refused when the document is validated, before any source is generated from it."""
    import json
    from modelc.extract import extract_tasks
    from modelc.schema import DocumentError
    from modelc.validate import check_workload
    consts = {"W": _w(1, 3 * H, IN), "R": _w(1, 3 * H, H), "B": _w(1, 6 * H)}
    m = _model("GRU", {"hidden_size": H}, consts, {"X": _x()}, ["Y", "Y_h"])
    (task,) = [t for t in extract_tasks(m) if t.template == "recurrent_steps"]
    wl = json.loads(json.dumps(task.workload))
    wl["ops"][0]["attrs"][attr] = value
    with pytest.raises(DocumentError, match="RecurrentSteps|attrs"):
        check_workload(wl, "wl")


def test_constant_sequence_lengths_and_a_single_unit_are_one_kernel():
    """Small constants reach the workload as params (lengths of up to 64 entries, the zero state of
    one unit): the kernel writes them out rather than leaving the layer to the numpy fallback."""
    consts = {"W": _w(2, 4 * H, IN), "R": _w(2, 4 * H, H), "sequence_lens": np.array([4, 5, 0], np.int32)}
    data = {"X": _x()}
    m = _model("LSTM", {"hidden_size": H, "direction": "bidirectional", "clip": 2.0}, consts, data,
               ["Y", "Y_h", "Y_c"])
    _check(m, data)
    data = {"X": _w(S, 1, IN)}
    m = _model("GRU", {"hidden_size": 1}, {"W": _w(1, 3, IN), "R": _w(1, 3, 1)}, data, ["Y", "Y_h"])
    _check(m, data)
