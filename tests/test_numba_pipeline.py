"""The cut-down numba pipeline for generated kernels (kernels/numba_pipeline.py) compiles them to
the same machine code as numba's full pipeline, faster; its typing memo leaves alone what it must."""
import operator
import re
import types as pytypes

import numba
import pytest
from numba import types
from numba.core.compiler import Compiler
from numba.core.typing.templates import AbstractTemplate, signature

from modelc.kernels import numba_pipeline
from modelc.kernels.template import get, select
from modelc.kernels.workload import Workload
from workloads import conv2d_wl, dense_wl, dw_wl


class FullPipeline(Compiler):
    """numba's default nopython pipeline, with the same noalias arguments."""

    def define_pipelines(self):
        self.state.flags.noalias = True
        return super().define_pipelines()


def _asm(source: str, pipeline) -> str:
    text = source.replace("cache=True", "cache=False").replace("pipeline_class=KernelCompiler",
                                                               "pipeline_class=_PIPELINE")
    mod = pytypes.ModuleType("modelc_pipeline_test")
    mod.__dict__["_PIPELINE"] = pipeline
    exec(compile(text, "<kernel>", "exec"), mod.__dict__)
    asm = mod.kernel._library.get_asm_str()
    return re.sub(r"(_ZN|cfunc\.)\S*", "SYM", asm)      # numba numbers each compile's symbols


@pytest.mark.parametrize("wl", [
    conv2d_wl(16, 9, 9, 32, 3, 1, 1, 1, 0),                          # register tile, packed weights
    dw_wl(32, 10, res=True),                                          # depthwise, clip, residual
    dense_wl((3, 40), 24, epi=("Gelu",)),                             # an inline='always' helper
    conv2d_wl(16, 12, 12, 32, 3, 1, 1, 1, 0),                       # Winograd (below)
], ids=["conv2d", "depthwise", "dense_gelu", "winograd"])
def test_kernels_compile_to_the_same_machine_code_as_the_full_pipeline(wl, request):
    wl = Workload(wl) if isinstance(wl, dict) else wl
    tpl = get("conv2d_winograd") if request.node.callspec.id == "winograd" else select(wl)
    kernel = tpl.build(wl, tpl.default_config(wl, tpl.space(wl)))
    assert "pipeline_class=KernelCompiler" in kernel.source
    assert _asm(kernel.source, numba_pipeline.KernelCompiler) == _asm(kernel.source, FullPipeline)


def test_typed_literals_are_made_once_to_the_same_machine_code():
    """`source` names each typed literal once before the loops (numba then types a Winograd
    kernel's 300 `np.float32(4.0)` once); LLVM folds the names back: the code is what the literals
    written in place compile to."""
    wl = conv2d_wl(16, 12, 12, 32, 3, 1, 1, 1, 0)
    tpl = get("conv2d_winograd")
    assert tpl.matches(wl)
    sp = tpl.space(wl)      # F(4x4)'s transforms (the default on this host may be F(2x2)'s)
    src = tpl.build(wl, sp.from_values(dict(tpl.default_config(wl, sp).values, tile_size=4))).source
    named = dict(re.findall(r"^    (lit__[0-9]+) = (np\.\w+\([^()]*\))$", src, re.M))
    assert len(named) >= 3 and "np.float32(4.0)" in named.values()
    body = [ln for ln in src.splitlines() if not re.match(r"    lit__[0-9]+ = ", ln)]
    assert not [ln for ln in body if re.search(r"np\.float32\([0-9.]+\)", ln)]
    inline = re.sub(r"^    lit__[0-9]+ = .*\n", "", src, flags=re.M)
    inline = re.sub(r"\blit__[0-9]+\b", lambda m: named[m.group(0)], inline)
    assert _asm(src, numba_pipeline.KernelCompiler) == _asm(inline, numba_pipeline.KernelCompiler)


def test_operator_typing_is_memoised_only_while_a_kernel_compiles():
    wl = dw_wl(16, 6)
    tpl = select(wl)
    _asm(tpl.build(wl, tpl.default_config(wl, tpl.space(wl))).source, numba_pipeline.KernelCompiler)
    assert numba_pipeline._active == 0
    assert any(k[0].typing_key is operator.mul and k[2] == (types.float32, types.float32)
               for k in numba_pipeline._memo)

    ctx = numba.core.registry.cpu_target.typing_context
    calls = []

    class UsersAdd(AbstractTemplate):        # typing outside kernels is numba's own, every time
        key = operator.add

        def generic(self, args, kws):
            calls.append(args)
            return signature(types.float64, *args)

    theirs = types.Function(UsersAdd)
    for _ in range(2):
        assert theirs.get_call_type(ctx, (types.float64, types.float64), {}).return_type == types.float64
    assert len(calls) == 2 and not any(k[0] is theirs for k in numba_pipeline._memo)


def _typing_error(pipeline) -> str:
    def f(x):
        y = x + 1
        return y.no_such_attribute
    with pytest.raises(numba.core.errors.TypingError) as e:
        numba.njit(pipeline_class=pipeline)(f)(1.0)
    return re.sub(r"\x1b\[[0-9;]*m", "", str(e.value))


def test_errors_while_a_kernel_compiles_carry_numbas_context():
    """`_ErrorContext` replaces numba's generator-based error context only while a kernel compiles,
    and the message says what numba's says: where typing failed and in which pass."""
    from numba.core import lowering, typeinfer
    ours, full = _typing_error(numba_pipeline.KernelCompiler), _typing_error(FullPipeline)
    assert "During: typing of get attribute" in ours and "During: Pass nopython_type_inference" in ours
    assert ours.replace("modelc kernel mode", "nopython mode") == full       # (the pipeline's name)
    assert numba_pipeline._active == 0
    for m in (lowering, typeinfer):
        ctx = m.new_error_context("x {loc}", loc=None)
        assert not isinstance(ctx, numba_pipeline._ErrorContext)        # numba's own outside kernels


def test_the_bytecode_rewrites_are_skipped_only_for_code_they_cannot_change():
    def plain(a, n):
        s = 0.0
        for i in range(n):
            if a[i] > 0:
                s += a[i] * 2.0
        return s

    def with_block(a):
        with a:
            return 1

    def try_block(a):
        try:
            return a[0]
        except IndexError:
            return 0

    def star_call(f, a):
        return f(*a)

    def dict_display(a):
        return {"a": a, **a}

    assert not numba_pipeline.needs_peepholes(plain.__code__)
    for f in (with_block, try_block, star_call, dict_display):
        assert numba_pipeline.needs_peepholes(f.__code__), f.__name__
