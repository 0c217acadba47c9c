"""Every kernel template over random shapes and random valid configs (hypothesis), vs the reference.

Each example compiles one kernel, so the example counts stay small; the seeds are fixed
(derandomize) so CI runs the same cases every time and a failure reproduces.
"""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelc.kernels import template, templates, testing  # noqa: F401
from modelc.kernels.workload import Workload
from workloads import conv2d_wl, dense_wl, dw_wl, matmul_wl, pool_wl, red_wl

SETTINGS = settings(max_examples=4, deadline=None, derandomize=True,
                    suppress_health_check=list(HealthCheck))


def _check(wl, name, pick):
    wl = wl if isinstance(wl, Workload) else Workload(wl)
    tpl = template.select(wl)
    assert tpl.name == name
    space = tpl.space(wl)
    valid = space.valid_indices(limit=5000)
    cfg = space.get(valid[pick % len(valid)])
    got, want, _, _ = testing.run(wl, tpl, cfg, seed=pick)
    assert testing.max_rel_error(got, want) <= 1e-5, f"{cfg}"


@SETTINGS
@given(c=st.sampled_from([3, 8, 16, 32]), k=st.sampled_from([16, 32]), hw=st.integers(5, 12),
       ks=st.sampled_from([1, 3]), s=st.sampled_from([1, 2]), res=st.booleans(), pick=st.integers(0, 10**6))
def test_conv2d(c, k, hw, ks, s, res, pick):
    p = ks // 2
    _check(conv2d_wl(C=c, H=hw, W=hw + 1, K=k, k=ks, s=s, p=p, hin=p, hout=pick % 2, residual=res), "conv2d", pick)


@SETTINGS
@given(c=st.sampled_from([8, 16, 48]), hw=st.integers(5, 14), s=st.sampled_from([1, 2]), pick=st.integers(0, 10**6))
def test_depthwise(c, hw, s, pick):
    _check(dw_wl(c, hw, s=s, hout=pick % 2), "depthwise_conv2d", pick)


@SETTINGS
@given(m=st.integers(1, 20), k=st.integers(1, 70), n=st.integers(1, 80), pick=st.integers(0, 10**6))
def test_dense(m, k, n, pick):
    _check(dense_wl((m, k), n, epi=("Relu",) if pick % 2 else ()), "dense", pick)


@SETTINGS
@given(b=st.integers(1, 3), m=st.integers(1, 20), k=st.integers(1, 40), n=st.integers(1, 40),
       pick=st.integers(0, 10**6))
def test_batch_matmul(b, m, k, n, pick):
    _check(matmul_wl((b, m, k), (b, k, n)), "batch_matmul", pick)


@SETTINGS
@given(op=st.sampled_from(["MaxPool", "AveragePool"]), c=st.sampled_from([8, 16]), hw=st.integers(4, 13),
       ceil=st.integers(0, 1), blocked=st.booleans(), pick=st.integers(0, 10**6))
def test_pool(op, c, hw, ceil, blocked, pick):
    lay = [c, 0] if blocked else None
    _check(pool_wl(op, 1, c, hw, hw, ceil=ceil, lin=lay, lout=lay), "pool", pick)


@SETTINGS
@given(op=st.sampled_from(["Softmax", "LogSoftmax", "ReduceMean", "ReduceMax"]),
       shape=st.lists(st.integers(1, 9), min_size=2, max_size=4), axis=st.integers(0, 3),
       pick=st.integers(0, 10**6))
def test_reductions(op, shape, axis, pick):
    axis = axis % len(shape)
    if op.startswith("Reduce"):
        wl = red_wl(op, shape, attrs={"keepdims": pick % 2}, axes=[axis])
        name = "reduce"
    else:
        wl = red_wl(op, shape, attrs={"axis": axis})
        name = "softmax"
    _check(wl, name, pick)
