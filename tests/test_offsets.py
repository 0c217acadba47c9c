"""Offsets that differ by a constant share one base (kernels/offsets.py): the same values, fewer
operations for numba to type and lower, and nothing moved where it would change a result."""
import numba
import numpy as np

from modelc.kernels.offsets import share_offsets


def _function(body: list):
    src = "\n".join(["import numpy as np", "def f(out0, in0, n, oy, k):"] + ["    " + ln for ln in body])
    scope: dict = {}
    exec(compile(src, "<body>", "exec"), scope)
    return numba.njit(scope["f"])


def _same_result(body: list, shared: list):
    rng = np.random.default_rng(0)
    in0 = rng.standard_normal(4096).astype(np.float32)
    for n, oy, k in ((0, 0, 3), (1, 2, 5), (3, 7, 1)):
        want, got = np.zeros(4096, np.float32), np.zeros(4096, np.float32)
        _function(body)(want, in0, n, oy, k)
        _function(shared)(got, in0, n, oy, k)
        np.testing.assert_array_equal(got, want)


def test_a_blocks_offsets_share_one_base_with_the_same_values():
    body = ["for jj in range(8):",
            "    v = in0[np.uintp(n * 512 + (oy + 1) * 16 + jj)]",
            "    w = in0[np.uintp(n * 512 + (oy + 1) * 16 + 3 + jj)] + in0[np.uintp(n * 512 + oy * 16 + jj + 48)]",
            "    if jj > 2:",
            "        out0[np.uintp((n) * 512 + (oy + 0 + 1) * 16 + jj + 1)] = v + w",
            "    out0[np.uintp(n * 512 + (oy + 1) * 16 - 5 + jj + 40)] = v * w"]
    shared = share_offsets(body)
    assert sum("b__0 = " in ln for ln in shared) == 1
    assert sum("oy" in ln for ln in shared) == 1          # the five offsets read oy once
    assert shared[1].startswith("    b__0 = ")              # inside the loop, before the first use
    _same_result(body, shared)


def test_unsigned_names_and_negative_constants():
    body = ["xb = np.uintp(n * 512 + oy * 16 + 64)",
            "for c in range(16):",
            "    a = in0[xb + np.uintp(0 + c)]",
            "    b = in0[xb + np.uintp(16 + c)]",
            "    out0[xb + np.uintp(c - 7)] = a - b",
            "    out0[xb + np.uintp(c * 2 + 100 - k * 0)] = a + b"]
    shared = share_offsets(body)
    assert any("b__0 = xb + np.uintp(c)" in ln for ln in shared)
    _same_result(body, shared)


def test_left_as_written_where_a_name_changes_between_uses():
    body = ["for jj in range(4):",
            "    t = jj",
            "    out0[np.uintp(t * 4 + 1)] = in0[np.uintp(jj)]",
            "    t = jj + 1",
            "    out0[np.uintp(t * 4 + 100)] = in0[np.uintp(jj + 1)]"]
    shared = share_offsets(body)
    assert not any("out0[b__" in ln for ln in shared)    # t changes: its two offsets stay apart
    assert any("in0[b__" in ln for ln in shared)         # jj does not
    _same_result(body, shared)


def test_loops_are_blocks_of_their_own_and_other_indices_stay():
    body = ["for jj in range(4):",
            "    out0[np.uintp(n * 8 + jj)] = in0[np.uintp(jj)]",
            "    for q in range(3):",
            "        out0[np.uintp(n * 8 + q + 100)] = in0[np.uintp(n * 8 + q + 200)]",
            "    out0[np.uintp(n * 8 + jj + 50)] = in0[jj + 1]",
            "    out0[jj + 300] = in0[np.uintp(min(jj, 2))]",
            "    out0[np.uintp(jj + 400)] = in0[np.uintp(jj * 1.0)] if False else in0[np.uintp(jj)]"]
    shared = share_offsets(body)
    inner = [ln for ln in shared if ln.startswith("        ")]
    assert inner[0].startswith("        b__") and "q" in inner[0]          # the inner loop's own base
    assert "out0[jj + 300] = in0[np.uintp(min(jj, 2))]" in "\n".join(shared)  # not sums of names
    _same_result(body, shared)


def test_a_body_with_nothing_to_share_is_unchanged():
    body = ["for jj in range(4):", "    out0[np.uintp(jj)] = in0[jj]", "    if jj > 1:", "        out0[3] = 1.0"]
    assert share_offsets(body) == body


def test_a_long_elif_chain_is_walked_not_recursed():
    """A concat of many parts selects its part through an if/elif chain (the 1,500 steps of a
    written-out LSTM): past Python's recursion limit, the pass failed with a RecursionError; it
    walks the chain, and shares the offsets in each branch as in any block."""
    n = 1200
    lines = ["for i in range(lo, hi):"]
    for k in range(n):
        lines += [f"    {'if' if k == 0 else 'elif'} i < {k + 1}:",
                  "        out0[np.uintp(i * 4 + 1)] = in0[np.uintp(i * 4 + 1)] + in0[np.uintp(i * 4 + 2)]"]
    out = share_offsets(lines)
    assert len(out) > len(lines) and out[-1].strip().startswith("out0[")
