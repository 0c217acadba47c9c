"""Transposes in injective groups are tiled: each item copies a tile of lines, read and written whole."""
import numpy as np
import pytest

from modelc.kernels import testing
from modelc.kernels.injective import Injective, _transpose_tile
from modelc.kernels.workload import Workload


def _wl(x_shape, ops, params, outs, dtype="float32"):
    """A workload of pure moves over one input; `outs` are (shape, value) pairs."""
    return Workload({"version": 1, "inputs": [{"shape": list(x_shape), "dtype": dtype, "const": False}],
                     "ops": [{"op": o, "attrs": a, "args": r} for o, a, r in ops],
                     "params": {k: {"dtype": "int64", "shape": [len(v)], "value": v} for k, v in params.items()},
                     "outputs": [{"shape": list(s), "dtype": dtype, "value": v} for s, v in outs]})


CASES = {
    # the transformer's K, transposed for Q x K^T: a slice of the QKV product, heads split, then moved
    "keys_transposed": (_wl([1, 40, 96], [("Slice", {}, ["i0", "p0", "p1", "p2"]), ("Reshape", {}, ["v0", "p3"]),
                                          ("Transpose", {"perm": [0, 2, 3, 1]}, ["v1"])],
                            {"p0": [32], "p1": [64], "p2": [-1], "p3": [1, 40, 2, 16]}, [([1, 2, 16, 40], "v2")]),
                        (2, 16)),
    # NCHW -> NHWC with a ragged last tile (37 = 2 x 16 + 5 pixels in a row)
    "nchw_to_nhwc": (_wl([1, 20, 9, 37], [("Transpose", {"perm": [0, 2, 3, 1]}, ["i0"])], {},
                         [([1, 9, 37, 20], "v0")]), (2, 16)),
    "matrix_float64": (_wl([50, 21], [("Transpose", {"perm": [1, 0]}, ["i0"])], {}, [([21, 50], "v0")],
                           "float64"), (0, 8)),
    "matrix_int8": (_wl([70, 130], [("Transpose", {"perm": [1, 0]}, ["i0"])], {}, [([130, 70], "v0")], "int8"),
                    (0, 64)),
    "matrix_float16": (_wl([33, 40], [("Transpose", {"perm": [1, 0]}, ["i0"])], {}, [([40, 33], "v0")],
                           "float16"), (0, 32)),
    # one tile of columns: the rows are cut into runs, so that every thread has items
    "one_tile_of_columns": (_wl([600, 16], [("Transpose", {"perm": [1, 0]}, ["i0"])], {}, [([16, 600], "v0")]),
                            (0, 16)),
    # the second output of a split: its own trace, not the first's
    "split_second_half": (_wl([40, 64], [("Transpose", {"perm": [1, 0]}, ["i0"]),
                                         ("Split", {"axis": 1, "num_outputs": 2}, ["v0"])], {},
                              [([64, 20], "v1.0"), ([64, 20], "v1.1")]), (0, 16)),
}


def _scaled_keys():
    """ViT-B/16's K (torch's dynamo export): taken out of the stacked Q, K, V by a Gather of a constant,
    heads split and transposed, then scaled by a constant as it is moved."""
    wl = _wl([3, 40, 1, 64], [("Gather", {}, ["i0", "p0"]), ("Reshape", {}, ["v0", "p1"]),
                              ("Transpose", {"perm": [1, 0, 2]}, ["v1"]), ("Transpose", {"perm": [0, 2, 1]}, ["v2"]),
                              ("Reshape", {}, ["v3", "p2"]), ("Mul", {}, ["v4", "p3"]), ("Neg", {}, ["v5"])],
             {"p1": [40, 4, 16], "p2": [1, 4, 16, 40]}, [([1, 4, 16, 40], "v6")])
    js = wl.json
    js["params"]["p0"] = {"dtype": "int64", "shape": [], "value": -2}
    js["params"]["p3"] = {"dtype": "float32", "shape": [1], "value": [0.35]}
    return Workload(js)


CASES["keys_gathered_and_scaled"] = (_scaled_keys(), (2, 16))


@pytest.mark.parametrize("name", sorted(CASES))
def test_tiled_transposes_match_the_reference(name):
    wl, tile = CASES[name]
    assert all(_transpose_tile(wl, [k], out) == tile for k, out in enumerate(wl.outputs))
    tpl = Injective()
    cfg = tpl.default_config(wl, tpl.space(wl))
    src = tpl.build(wl, cfg).source
    assert f"range(b{tile[0]} * {tile[1]}" in src
    assert name != "one_tile_of_columns" or "c1 = " in src
    got, want, fn, args = testing.run(wl, tpl, cfg)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    if wl.outputs[0].dtype.kind == "f":              # every element stored by exactly one item
        assert (testing.stores_per_output(fn, args) == 1).all()


@pytest.mark.parametrize("ops, x_shape, out_shape", [
    ([("Transpose", {"perm": [1, 0, 2]}, ["i0"])], [24, 40, 32], [40, 24, 32]),      # rows moved, lines kept
    ([("Transpose", {"perm": [1, 0]}, ["i0"])], [8, 64], [64, 8]),                   # a last axis under a line
    ([("Slice", {}, ["i0", "p0", "p1", "p2", "p3"]), ("Transpose", {"perm": [1, 0]}, ["v0"])],
     [64, 48], [48, 64]),                                     # reversed rows: no axis reads ahead contiguously
])
def test_moves_that_keep_lines_whole_are_not_tiled(ops, x_shape, out_shape):
    params = {"p0": [-1], "p1": [-(1 << 40)], "p2": [1], "p3": [-1]}      # (the Slice's: column 47 down)
    wl = _wl(x_shape, ops, params, [(out_shape, f"v{len(ops) - 1}")])
    assert _transpose_tile(wl, [0], wl.outputs[0]) is None
    got, want, _, _ = testing.run(wl, Injective(), None)
    assert np.array_equal(got[0], want[0])


def test_a_move_scaled_per_element_by_a_tensor_is_left_untiled():
    """Only scalar constants may ride along a traced move: a tensor operand could broadcast the
    value to another shape, which a move traced without it would not have."""
    wl = _wl([64, 48], [("Transpose", {"perm": [1, 0]}, ["i0"]), ("Mul", {}, ["v0", "p0"])], {},
             [([48, 64], "v1")])
    js = wl.json
    js["params"]["p0"] = {"dtype": "float32", "shape": [64], "value": [0.5] * 64}
    wl = Workload(js)
    assert _transpose_tile(wl, [0], wl.outputs[0]) is None
    got, want, _, _ = testing.run(wl, Injective(), None)
    assert np.array_equal(got[0], want[0])
