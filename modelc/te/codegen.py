"""Kernel source for a KernelPlan under an annotation of its sketch, in the form PERFORMANCE.md
found fast: register tiles as stack arrays with the rows written out, the innermost spatial axis in
constant-trip loops of the target's vector lanes, flat arrays at `np.uintp` offsets, the outer loops
fused into one parallel loop of work items (`_Nest` says in what order). Tensors and variables get
names made here (`out0`, `in1`, `q0`, `r0`): nothing a user named reaches the source.
"""
from __future__ import annotations

import itertools
import math
import re

import numpy as np

from ..kernels.expr import ctor, lit
from ..kernels.intrinsics import FASTMATH, exp_polynomial, imports
from ..kernels.template import parallel_loop, source
from .bounds import unproven_reads
from ..errors import ModelcError
from .expr import Binary, Call, Cast, Const, Read, Select, Var
from .lower import Acc, KernelPlan
from .sketch import default_values, lanes_of, row_axis, unrolled

_F32 = lambda text: f"np.float32({text})"  # noqa: E731
FAST_EXP = [imports("f32_from_bits"), "", f"@numba.njit(fastmath={FASTMATH})", "def fast_exp32(x):",
            "    d = min(max(x, np.float32(-87.0)), np.float32(87.0))",
            *("    " + ln for ln in exp_polynomial("e", "d", "t", "r", "p", _F32)), "    return e", ""]
_INIT = {"sum": lambda dt: lit(0, dt),
         "max": lambda dt: lit(-np.inf, dt) if np.dtype(dt).kind == "f" else lit(np.iinfo(dt).min, dt),
         "min": lambda dt: lit(np.inf, dt) if np.dtype(dt).kind == "f" else lit(np.iinfo(dt).max, dt)}


def _c(dtype) -> str:
    """The dtype a value of `dtype` is computed in: float16 in float32 (intrinsics.h2f)."""
    return "float32" if dtype == "float16" else str(dtype)


class _Emitter:
    """Expressions as numba source. float16 values live in float32 variables: loads convert
    (`h2f`), each arithmetic result is rounded to float16 (`r16`), as numpy and ONNX's reference
    compute float16 op by op, except inside a reduction's source, whose products are accumulated in
    float32 as onnxruntime's and numpy's float16 MatMul do; stores convert back (`f2h`)."""

    def __init__(self, names: dict, clamp: set):
        self.names, self.clamp = names, clamp        # id(tensor) -> arg name; ids of reads to clamp
        self.exact = False                           # inside a reduction's source: no float16 rounding

    def reduced(self, e, env: dict) -> str:
        self.exact = True
        try:
            return self(e, env)
        finally:
            self.exact = False

    def _round(self, e, text: str) -> str:
        return f"r16({text})" if e.dtype == "float16" and not self.exact else text

    def __call__(self, e, env: dict) -> str:
        if isinstance(e, Const):
            return lit(e.value, _c(e.dtype))
        if isinstance(e, Var):
            v = env[id(e)]
            return v if v.isidentifier() or _INT.fullmatch(v) else f"({v})"    # "m0 + 1" inside "x * 2"
        if isinstance(e, Acc):
            return self._round(e, env["acc"])
        if isinstance(e, Read):
            shape = e.tensor.shape
            idx = [self(ix, env) for ix in e.indices]
            if id(e) in self.clamp:
                idx = [f"min(max({ix}, 0), {n - 1})" for ix, n in zip(idx, shape)]
            ref = f"{self.names[id(e.tensor)]}[{offset(idx, shape)}]"
            return f"h2f({ref})" if e.tensor.dtype == "float16" else ref
        if isinstance(e, Binary):
            folded = _reassociate(e)
            if folded is not e:
                return self(folded, env)
            a, b = self(e.a, env), self(e.b, env)
            if e.a.dtype == e.b.dtype == e.dtype and np.dtype(e.dtype).kind in "iu":
                folded = _fold(e.op, a, b, str(e.dtype))
                if folded is not None:
                    return folded
            op = {"&&": "and", "||": "or"}.get(e.op, e.op)
            return self._round(e, f"({a} {op} {b})")
        if isinstance(e, Select):
            return f"({self(e.a, env)} if {self(e.cond, env)} else {self(e.b, env)})"
        if isinstance(e, Cast):
            a = self(e.a, env)
            if e.dtype == "bool":
                return f"({a} != 0)"
            return f"r16({ctor('float32')}({a}))" if e.dtype == "float16" else f"{ctor(e.dtype)}({a})"
        if isinstance(e, Call):
            return self._round(e, _call(e, [self(a, env) for a in e.operands]))
        raise TypeError(f"no code for {type(e).__name__}")


_INT = re.compile(r"-?[0-9]+")
_INT_LIT = re.compile(r"np\.u?int(?:8|16|32|64)\((-?[0-9]+)\)|(-?[0-9]+)")


def _fold(op: str, a: str, b: str, dtype: str) -> str | None:
    """`a op b` without the identities index arithmetic is full of (a conv's `(oh * 1 + kh * 1) - 0`):
    LLVM would fold them anyway, but numba types and lowers every one first, and a te kernel's
    compile took up to 5 s (SqueezeNet's 1x1 convs). Operands of one integer dtype only."""
    def value(text):
        m = _INT_LIT.fullmatch(text)
        return None if m is None else int(m.group(1) or m.group(2))
    x, y = value(a), value(b)
    if op == "*" and (x == 0 or y == 0) and dtype == "int64":
        return "0"                  # a Python 0 is int64 to numba (mixed with uint64: float64)
    if op == "*" and (x == 1 or y == 1):
        return b if x == 1 else a
    if op == "+" and (x == 0 or y == 0):
        return b if x == 0 else a
    if op == "-" and y == 0:
        return a
    return None


def _reassociate(e: Binary):
    """An integer `(x + c1) - c2` as `x + (c1 - c2)` and `c1 * c2` as its value: a padded conv's
    input row is `(oh * 2 + kh) - 3` read from a buffer whose halo adds 3 back, and numba types and
    lowers each of the operations before LLVM folds them. Integers wrap around, so the sums are
    the same values; `e` itself where nothing folds."""
    if np.dtype(e.dtype).kind not in "iu" or e.op not in ("+", "-", "*") or not e.a.dtype == e.dtype == e.b.dtype:
        return e
    a, b = e.a, e.b
    try:
        if isinstance(a, Const) and isinstance(b, Const):
            return Const({"+": a.value + b.value, "-": a.value - b.value, "*": a.value * b.value}[e.op], e.dtype)
        if (e.op != "*" and isinstance(b, Const) and isinstance(a, Binary) and a.op in ("+", "-")
                and isinstance(a.b, Const) and a.dtype == e.dtype):
            c = (a.b.value if a.op == "+" else -a.b.value) + (b.value if e.op == "+" else -b.value)
            return a.a if c == 0 else Binary("+" if c > 0 else "-", a.a, Const(abs(c), e.dtype), e.dtype)
    except (OverflowError, ModelcError):    # a constant the dtype cannot hold: left as written
        pass
    return e


def _call(e: Call, a: list) -> str:
    dt = _c(e.dtype)
    f32 = dt == "float32"
    fl = np.dtype(dt).kind == "f"
    if e.fn in ("max", "min"):      # NaN in, NaN out (numpy's maximum, ONNX's Max/Clip/Relu)
        return f"{('fmaximum' if e.fn == 'max' else 'fminimum') if fl else e.fn}({a[0]}, {a[1]})"
    if e.fn == "exp":
        return f"fast_exp32({a[0]})" if f32 else f"math.exp({a[0]})"
    if e.fn == "erf":
        return f"fast_erf({a[0]})" if f32 else f"math.erf({a[0]})"
    if e.fn == "sigmoid":
        return f"fast_sigmoid32({a[0]})" if f32 else f"({lit(1, dt)} / ({lit(1, dt)} + math.exp(-{a[0]})))"
    if e.fn == "abs":
        return f"abs({a[0]})"
    if e.fn == "fmod":              # numba has no math.fmod; the helper is compiled without fast-math
        return f"fmod_exact({a[0]}, {a[1]})"
    return f"math.{e.fn}({a[0]})"


def offset(idx: list, shape) -> str:
    """The row-major offset of `idx` in a flat array of `shape`, unsigned."""
    terms = []
    for k, ix in enumerate(idx):
        stride = math.prod(shape[k + 1:])
        if ix != "0":
            terms.append(ix if stride == 1 else f"({ix}) * {stride}")
    return f"np.uintp({' + '.join(terms) or '0'})"


_TRIVIAL = re.compile(r"np\.uintp\(\w+\)")        # an offset that is one name: nothing to share


def _offsets(line: str) -> list:
    """The `np.uintp(...)` offsets in a line of generated source, as written."""
    out, i = [], line.find("np.uintp(")
    while i >= 0:
        depth = 0
        for k in range(i + len("np.uintp"), len(line)):
            depth += {"(": 1, ")": -1}.get(line[k], 0)
            if depth == 0:
                out.append(line[i:k + 1])
                break
        else:
            return out
        i = line.find("np.uintp(", k + 1)
    return out


def kernel_source(p: KernelPlan, values: dict | None = None) -> tuple[str, list]:
    """(source, tensors): the kernel module under the annotation `values` (knob values of
    sketch.space; None: its default), and the tensors bound to its arguments, in order."""
    v = default_values(p) if values is None else values
    tensors = [p.tensor, *p.reads]
    names = {id(t): (f"out{k}" if k == 0 else f"in{k - 1}") for k, t in enumerate(tensors)}
    clamp = set()
    for e in ([p.reduce.source] if p.reduce is not None else []) + [p.value]:
        clamp |= {id(r) for r, *_ in unproven_reads(e)}
    nest = _Nest(p, v, _Emitter(names, clamp), lanes_of(p))
    body = nest.lines()
    extra = FAST_EXP if any("fast_exp32(" in ln for ln in body) else []    # (fmaximum ...: source() adds)
    dtypes = [t.dtype for t in tensors]
    return source([names[id(t)] for t in tensors], dtypes, body, extra=extra), tensors


class _Nest:
    """The loop nest of one annotated kernel.

    Items of the parallel loop: the other spatial indices x tiles of `row_axis2` x groups of
    `m_group` row tiles (rows: `row_axis`) x column tiles (the last axis; rows-first or
    columns-first by `order`). In an item: the accumulators of its row tiles (tile_m x tile_m2
    rows of tile_n lanes each) on the stack; the outermost reduce axis in blocks of `k_block`,
    each block run over all the item's tiles before the next; the innermost reduce axis unrolled
    by `k_unroll`, or a small reduction written out whole inside the lane loop (`unroll`: its taps x
    rows update the accumulators in one loop body); one loop over the tile's lanes innermost, rows
    written out. A last tile past
    the end of its axis is shifted back to end there and stores only what the tile before it did
    not: every output element is stored by exactly one item.
    """

    def __init__(self, p: KernelPlan, v: dict, emit: _Emitter, lanes: int):
        self.p, self.emit = p, emit
        self.shape = shape = list(p.tensor.shape)
        self.n = len(shape)
        self.dt = _c(p.reduce.dtype if p.reduce is not None else p.tensor.dtype)    # the accumulators'
        self.vred = v.get("vectorize") == "reduce"      # lanes along the innermost reduce axis
        self.L = lanes
        self.NR = 1 if self.vred else v["tile_n"]
        self.G = v.get("m_group", 1)
        self.U = v.get("k_unroll", 1)
        self.unrolled = p.reduce is not None and not self.vred and unrolled(p, v) > 0
        self.rows_first = v.get("order", ["m", "n"])[0] == "m"
        self.R = row_axis(p, v) if self.n >= 2 else None
        self.rows = rows = shape[self.R] if self.n >= 2 else 1
        # a tile wider than its axis is the axis
        self.MR, self.NR = min(v.get("tile_m", 1) if self.n >= 2 else 1, rows), min(self.NR, shape[-1])
        self.NT = -(-shape[-1] // self.NR)
        self.MT = -(-rows // self.MR)
        self.shift_n = shape[-1] % self.NR != 0       # the last tile is shifted back to end at the end
        self.shift_m = rows % self.MR != 0
        if self.MT % self.G:
            raise ModelcError(f"m_group {self.G} does not divide the {self.MT} row tiles")
        self.MG = self.MT // self.G
        self.g = 0                                    # the row tile being written (_tiles)
        # a second axis of register rows (Ansor tiles every spatial axis): its tiles are items
        self.R2 = v.get("row_axis2", -1) if self.n >= 2 else -1
        self.MR2 = min(v.get("tile_m2", 1), shape[self.R2]) if self.R2 >= 0 else 1
        self.MT2 = -(-shape[self.R2] // self.MR2) if self.R2 >= 0 else 1
        self.shift_m2 = self.R2 >= 0 and shape[self.R2] % self.MR2 != 0
        self.outer_axes = [d for d in range(self.n - 1) if d not in (self.R, self.R2)]
        self.outer = [shape[d] for d in self.outer_axes]
        self.KB = None
        if p.reduce is not None:
            a0 = p.reduce.axes[0]
            kb = v.get("k_block", a0.hi - a0.lo)
            if kb != a0.hi - a0.lo:
                if (a0.hi - a0.lo) % kb:
                    raise ModelcError(f"k_block {kb} does not divide the reduce extent {a0.hi - a0.lo}")
                self.KB = kb
        self.n_offsets = 0                            # offsets named by _shared
        self.nrows = self.MR * self.MR2
        self.tile = self.nrows * (self.U * lanes if self.vred else self.NR)

    def lines(self) -> list:
        ind = "    "
        items = math.prod(self.outer) * self.MG * self.NT * self.MT2
        body = [parallel_loop("it", items)]
        inner = [("nt", self.NT), ("mg", self.MG)] if self.rows_first else [("mg", self.MG), ("nt", self.NT)]
        if self.R2 >= 0:
            inner.insert(0, ("m2t", self.MT2))
        rest = "it"
        for name, ext in [*reversed(inner), *((f"q{d}", e) for d, e in
                                              reversed(list(zip(self.outer_axes, self.outer))))]:
            if ext == 1:
                body.append(f"{ind}{name} = 0")
                continue
            body += [f"{ind}{name} = {rest} % {ext}", f"{ind}rest = {rest} // {ext}"]
            rest = "rest"
        if self.shift_n:
            body += [f"{ind}j0 = min(nt * {self.NR}, {self.shape[-1] - self.NR})", f"{ind}sj = nt * {self.NR} - j0"]
        else:
            body.append(f"{ind}j0 = nt * {self.NR}")
        if self.shift_m2:
            ext = self.shape[self.R2]
            body += [f"{ind}m20 = min(m2t * {self.MR2}, {ext - self.MR2})", f"{ind}s2 = m2t * {self.MR2} - m20"]
        elif self.R2 >= 0:
            body.append(f"{ind}m20 = m2t * {self.MR2}")
        if self.p.reduce is not None:
            size = self.G * self.tile
            body += [f"{ind}acc = carray(stack_empty({size}, {ctor(self.dt)}), {size})",
                     f"{ind}for q in range({size}):", f"{ind}    acc[q] = {_INIT[self.p.reduce.op](self.dt)}"]
            inner_lines = self._tiles(self._reduce_tile)
            if self.KB is not None:
                a0 = self.p.reduce.axes[0]
                body.append(f"{ind}for kb in range({(a0.hi - a0.lo) // self.KB}):")
                body += ["    " + ind + ln for ln in inner_lines]
            else:
                body += [ind + ln for ln in inner_lines]
        body += [ind + ln for ln in self._tiles(self._store_tile)]
        return body

    def _tiles(self, fn) -> list:
        """fn() for each of the item's row tiles, written out one after another (a loop over
        them made the accumulators' offsets variable, and LLVM then stored every update to the
        stack: 2x slower). A last tile past the end of its axis is shifted back to end there (its
        first rows and columns were the tile before's), so every tile is the same code; stores
        skip what the tile before stored (`sm` rows, `sj` columns), so each output has one writer."""
        out = []
        for g in range(self.G):
            self.g = g
            out.append(f"mt = mg * {self.G} + {g}" if self.G > 1 else "mt = mg")
            if self.shift_m:
                out += [f"m0 = min(mt * {self.MR}, {self.rows - self.MR})", f"sm = mt * {self.MR} - m0"]
            else:
                out.append(f"m0 = mt * {self.MR}")
            out += fn()
        return out

    def _envs(self) -> list:
        """The index environment of each register row (row-axis rows x second-axis rows)."""
        env = {id(self.p.axis[d]): f"q{d}" if self.shape[d] > 1 else "0" for d in self.outer_axes}
        if self.n < 2:
            return [env]
        out = []
        for m in range(self.nrows):
            m1, m2 = divmod(m, self.MR2)
            e = {**env, id(self.p.axis[self.R]): f"m0 + {m1}" if m1 else "m0"}
            if self.R2 >= 0:
                e[id(self.p.axis[self.R2])] = f"m20 + {m2}" if m2 else "m20"
            out.append(e)
        return out

    def _owned(self, m: int) -> list:
        """Conditions for row m to be this tile's (a shifted tile skips rows the one before stored)."""
        m1, m2 = divmod(m, self.MR2)
        most1 = (self.MR - self.rows % self.MR) if self.shift_m else 0
        most2 = (self.MR2 - self.shape[self.R2] % self.MR2) if self.shift_m2 else 0
        return [c for c, on in ((f"sm <= {m1}", m1 < most1), (f"s2 <= {m2}", m2 < most2)) if on]

    def _acc(self, m: int, q: int = 0) -> str:
        """Accumulator of row m (and, vectorising a reduction, of its set q) at lane jj."""
        at = self.g * self.tile + (m * self.U * self.L + q * self.L if self.vred else m * self.NR)
        return f"{at} + jj" if at else "jj"

    def _shared(self, rows: list) -> list:
        """A lane loop's body with each offset that two of its updates compute named once, first:
        the rows of a register tile read the same weights (and neighbouring taps the same inputs),
        and numba types and lowers every copy of an offset before LLVM's CSE merges them (a 7x7
        conv's input offset is ~15 operations). The body holds only accumulator updates, so an
        offset computed at its top has the values it has where it stood."""
        calls = [_offsets(r) for r in rows]
        counts: dict = {}
        for cs in calls:
            for c in set(cs):
                counts[c] = counts.get(c, 0) + 1
        named = {}
        shared = [c for c, k in counts.items() if k > 1 and not _TRIVIAL.fullmatch(c)]
        for c in sorted(shared, key=len, reverse=True):
            named[c] = f"o__{self.n_offsets}"
            self.n_offsets += 1
        out = [f"{n} = {c}" for c, n in named.items()]
        for r in rows:
            for c, n in named.items():
                r = r.replace(c, n)
            out.append(r)
        return out

    def _update(self, a: str, val: str) -> str:
        op = self.p.reduce.op
        if op == "sum":
            return f"{a} = {a} + {val}"
        fn = ("fmaximum" if op == "max" else "fminimum") if np.dtype(self.dt).kind == "f" else op
        return f"{a} = {fn}({a}, {val})"

    def _reduce_tile(self) -> list:
        if self.vred:
            return self._reduce_lanes()
        p, red = self.p, self.p.reduce
        lane = {id(p.axis[-1]): "j0 + jj"}
        out, ind = [], ""
        axes = red.axes
        last = len(axes) - 1
        renv = {id(a): f"r{k}" for k, a in enumerate(axes)}
        one = {k for k, a in enumerate(axes) if a.hi - a.lo == 1 and not (k == 0 and self.KB is not None)}
        renv.update({id(axes[k]): str(axes[k].lo) for k in one})      # no loop of one trip
        envs = [{**e, **renv, **lane} for e in self._envs()]

        def step(ind, at=None):
            env_k = envs if at is None else [{**e, id(axes[last]): at} for e in envs]
            rows = [self._update(f'acc[{self._acc(m)}]', self.emit.reduced(red.source, env))
                    for m, env in enumerate(env_k)]
            return [f"{ind}for jj in range({self.NR}):", *(ind + "    " + ln for ln in self._shared(rows))]

        if self.unrolled:               # the whole reduction written out, inside one lane loop
            rows = []
            for taps in itertools.product(*(range(a.lo, a.hi) for a in axes)):
                at = {id(a): str(t) for a, t in zip(axes, taps)}
                rows += [self._update(f'acc[{self._acc(m)}]', self.emit.reduced(red.source, {**env, **at}))
                         for m, env in enumerate(envs)]
            return [f"for jj in range({self.NR}):", *("    " + ln for ln in self._shared(rows))]
        for k, a in enumerate(axes):
            if k in one:
                continue
            lo, hi = a.lo, a.hi
            if k == 0 and self.KB is not None:
                lo, hi = f"{a.lo} + kb * {self.KB}", f"{a.lo} + kb * {self.KB} + {self.KB}"
                ext = self.KB
            else:
                ext = a.hi - a.lo
            if k == last and self.U > 1 and ext >= self.U:
                main = ext - ext % self.U
                out.append(f"{ind}for ru in range({main // self.U}):")
                out.append(f"{ind}    r{k} = {lo} + ru * {self.U}")
                for q in range(self.U):
                    out += step(ind + "    ", f"r{k} + {q}" if q else None)
                for q in range(main, ext):
                    out += step(ind, f"{lo} + {q}")
                return out
            out.append(f"{ind}for r{k} in range({lo}, {hi}):")
            ind += "    "
        return out + step(ind)

    def _reduce_lanes(self) -> list:
        """One output per row, the innermost reduce axis in vectors: `k_unroll` sets of lanes
        (independent chains of adds), summed when stored. Ansor's rfactor, for reductions along
        contiguous memory (a row's sum, max or norm)."""
        p, red = self.p, self.p.reduce
        axes = red.axes
        last, step = len(axes) - 1, self.U * self.L
        out, ind = [], ""
        renv = {id(a): f"r{k}" if a.hi - a.lo > 1 else str(a.lo) for k, a in enumerate(axes)}
        envs = [{**e, **renv, id(p.axis[-1]): "j0"} for e in self._envs()]
        for k, a in enumerate(axes[:-1]):
            if a.hi - a.lo == 1:
                continue
            out.append(f"{ind}for r{k} in range({a.lo}, {a.hi}):")
            ind += "    "
        a = axes[last]
        ext = a.hi - a.lo
        main = ext - ext % step
        if main:
            out += [f"{ind}for rv in range({main // step}):", f"{ind}    rb = {a.lo} + rv * {step}",
                    f"{ind}    for jj in range({self.L}):"]
            for q in range(self.U):
                at = f"rb + {q * self.L} + jj" if q else "rb + jj"
                for m, env in enumerate(envs):
                    v = self.emit.reduced(red.source, {**env, id(a): at})
                    out.append(f"{ind}        {self._update(f'acc[{self._acc(m, q)}]', v)}")
        if ext % step:
            out.append(f"{ind}for jj in range({ext % step}):")
            for m, env in enumerate(envs):
                v = self.emit.reduced(red.source, {**env, id(a): f"{a.lo + main} + jj"})
                out.append(f"{ind}    {self._update(f'acc[{self._acc(m)}]', v)}")
        return out

    def _out(self, idx: list) -> str:
        """The output's offset: in its own shape, or inside the buffer it is stored in."""
        if self.p.store is None:
            return offset(idx, self.shape)
        shape, origin = self.p.store
        return offset([ix if not o else f"{ix} + {o}" for ix, o in zip(idx, origin)], shape)

    def _stored(self, value, env: dict) -> str:
        text = self.emit(value, env)
        return f"f2h({text})" if self.p.tensor.dtype == "float16" else text

    def _store_tile(self) -> list:
        p = self.p

        def guard(m, lines):
            cond = self._owned(m)
            return [f"if {' and '.join(cond)}:", *("    " + ln for ln in lines)] if cond else lines
        if self.vred:
            out = []
            for m, env in enumerate(self._envs()):
                s = f"red{m}"          # not s{m}: s2 is the second row axis's shift
                e = {**env, id(p.axis[-1]): "j0", "acc": s}
                idx = [e[id(a)] for a in p.axis]
                out += guard(m, [f"{s} = {_INIT[p.reduce.op](self.dt)}", f"for jj in range({self.U * self.L}):",
                                 f"    {self._update(s, f'acc[{self._acc(m)}]')}",
                                 f"out0[{self._out(idx)}] = {self._stored(p.value, e)}"])
            return out
        lane = {id(p.axis[-1]): "j0 + jj"}
        head = f"for jj in range(sj, {self.NR}):" if self.shift_n else f"for jj in range({self.NR}):"
        stores = []
        for m, env in enumerate(self._envs()):
            e = {**env, **lane, "acc": f"acc[{self._acc(m)}]"}
            idx = [e[id(a)] for a in p.axis]
            stores.append(f"out0[{self._out(idx)}] = {self._stored(p.value, e)}")
        if not any(self._owned(m) for m in range(self.nrows)):
            return [head, *("    " + st for st in stores)]
        return [ln for m, st in enumerate(stores) for ln in guard(m, [head, "    " + st])]
