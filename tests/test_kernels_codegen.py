"""The templates' shared scaffolding: the source it writes computes what it says."""
import itertools

import pytest

from modelc import target
from modelc.kernels.codegen import ParallelItem, row_waste, shifted_start, unravel_index, worth_parallel
from modelc.target import Target


def run(lines, **env):
    exec("\n".join(ln.strip() for ln in lines), {}, env)
    return env


@pytest.mark.parametrize("extents", [(7,), (3, 4), (2, 5, 3)])
def test_parallel_item_unravels_innermost_first(extents):
    names = [f"a{k}" for k in range(len(extents))] + ["outer"]
    total = 1
    for e in extents:
        total *= e
    for it in range(total * 2):
        item = ParallelItem()
        lines = [ln for k, e in enumerate(extents[:-1]) for ln in item.take(names[k], e)]
        lines += item.last(names[-2], extents[-1], "outer")
        env = run(lines, it=it)
        want, rest = [], it
        for e in extents:
            want.append(rest % e)
            rest //= e
        assert [env[n] for n in names] == want + [rest]


def test_a_coordinate_may_be_wrapped_into_a_tile_start():
    item = ParallelItem("pi", ind="  ")
    lines = item.take("oh0", 5, lambda r: shifted_start(f"{r} * 3", 13, 3))
    assert lines == ["  oh0 = min((pi % 5) * 3, 10)", "  rest = pi // 5"]


@pytest.mark.parametrize("extent,size", [(10, 3), (9, 3), (7, 7), (16, 5)])
def test_shifted_tiles_cover_the_extent_and_stay_inside(extent, size):
    starts = [eval(shifted_start(f"{t} * {size}", extent, size)) for t in range(-(-extent // size))]
    covered = {s + k for s in starts for k in range(size)}
    assert covered == set(range(extent))
    assert shifted_start("t * 4", "(n - ph) // 2", 4) == "min(t * 4, (n - ph) // 2 - 4)"


def test_unravel_index_is_row_major_and_skips_unit_dims():
    dims = (2, 1, 3, 4)
    lines, exprs = unravel_index("m", dims, "r")
    assert exprs[1] == "0" and len(lines) == 3
    for m, idx in enumerate(itertools.product(*map(range, dims))):
        env = run(lines, m=m)
        assert tuple(env[e] if e != "0" else 0 for e in exprs) == idx


def test_row_waste_and_parallel_defaults():
    assert row_waste(56)(14) == 0 and row_waste(56)(12) == pytest.approx(4 / 56)
    for threads, work, want in ((2, 65536, True), (2, 65535, False), (4, 65536, False), (1, 10 ** 9, False)):
        with target.use(Target.from_features("znver4", "+avx2,+avx512f", threads=threads)):
            assert worth_parallel(work, 32768) is want


def pool(op, out_hw):
    from modelc.kernels.workload import Workload
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1] * 4} if op == "MaxPool" else {}
    out_hw = [4, 4] if op == "MaxPool" else out_hw
    return Workload({"version": 1, "params": {},
                     "inputs": [{"shape": [1, 16, 8, 8], "dtype": "float32", "const": False, "layout": [16, 1]}],
                     "ops": [{"op": op, "attrs": attrs, "args": ["i0"]}],
                     "outputs": [{"shape": [1, 16, *out_hw], "dtype": "float32", "value": "v0",
                                  "layout": [16, 0]}]})


def test_conv_dense_and_pool_templates_declare_their_parallel_loop():
    """`source` runs only declared loops on the threads: each template here declares its loop."""
    from modelc.kernels import template, templates  # noqa: F401
    from test_kernels_target import conv, dense

    for wl, name in [(conv(16, 8, 32), "conv2d"), (conv(16, 8, 32), "conv2d_winograd"),
                     (conv(16, 8, 16, group=16), "depthwise_conv2d"),
                     (conv(16, 8, 32, group=2, layout=False), "conv_generic"), (dense(5, 16, 24), "dense"),
                     (pool("MaxPool", [1, 1]), "pool"), (pool("GlobalAveragePool", [1, 1]), "pool")]:
        t = template.get(name)
        src = t.build(wl, t.default_config(wl, t.space(wl))).source
        assert "in range(lo, hi):" in src and "in prange(" not in src, name


def test_arrays_a_kernel_only_indexes_are_pointers():
    """numba lowers an array access through its struct every time; a pointer's is one load. Only
    arrays the body does nothing but index become pointers."""
    from modelc.kernels.template import pointers

    body = ["acc = carray(stack_empty(16, np.float32), 16)",
            "buf = carray(stack_empty(8, np.float32), 8)",
            "for q in range(16):",
            "    acc[q] = in0[q] * w[q] + np.sum(buf)",
            "out0[np.uintp(1)] = acc[1] + in1.shape[0] + f(in2)"]
    lines, direct = pointers(body, ["out0", "in0", "w", "in1", "in2", "unused"], ["float32"] * 6)
    assert direct == {"out0", "in0", "w"}
    assert pointers(body, ["out0", "in0"], ["bool", "float32"])[1] == {"in0"}   # stored as bytes
    assert lines[0] == "acc = stack_empty(16, np.float32)" and lines[1] == body[1]   # buf is passed on
    assert lines[2:] == body[2:]


def test_templates_index_pointers_and_stack_memory():
    from modelc.kernels import template, templates  # noqa: F401
    from test_kernels_target import conv

    wl = conv(16, 8, 32)
    t = template.get("conv2d")
    src = t.build(wl, t.default_config(wl, t.space(wl))).source
    assert "    out0 = ptr__0" in src and "acc = stack_empty(" in src and "carray(" not in src
