"""The tensor-expression IR: small immutable nodes a declaration builds by ordinary Python operators.

`==` builds a comparison (as in TVM), so nodes are compared structurally only through `key`, and an
expression has no truth value: `and`/`or`/`if` on one would silently pick a branch at declaration
time, so they raise and point to `&`, `|` and `te.if_then_else`.
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelcError

DTYPES = ("float32", "float64", "float16", "int32", "int64", "bool")   # float16: computed in float32, rounded per op
INDEX = "int64"                      # the dtype of iteration variables and index arithmetic
ARITH = ("+", "-", "*", "/", "//", "%")
CMP = ("<", "<=", ">", ">=", "==", "!=")
LOGIC = ("&&", "||")
FUNCS = {"exp": 1, "log": 1, "sqrt": 1, "tanh": 1, "erf": 1, "sigmoid": 1, "abs": 1, "max": 2, "min": 2, "fmod": 2}


class DeclarationError(ModelcError):
    """A computation declared wrongly; the message names the stage being declared."""


_stages: list = []                   # names of the stages being declared (te.compute pushes one)


def fail(msg: str):
    where = f"stage {_stages[-1]!r}: " if _stages else ""
    raise DeclarationError(where + msg)


def check_dtype(dtype) -> str:
    try:
        name = np.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        fail(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    return name


class Expr:
    __slots__ = ()
    dtype: str

    def __add__(self, o): return binary("+", self, o)
    def __radd__(self, o): return binary("+", o, self)
    def __sub__(self, o): return binary("-", self, o)
    def __rsub__(self, o): return binary("-", o, self)
    def __mul__(self, o): return binary("*", self, o)
    def __rmul__(self, o): return binary("*", o, self)
    def __truediv__(self, o): return binary("/", self, o)
    def __rtruediv__(self, o): return binary("/", o, self)
    def __floordiv__(self, o): return binary("//", self, o)
    def __rfloordiv__(self, o): return binary("//", o, self)
    def __mod__(self, o): return binary("%", self, o)
    def __rmod__(self, o): return binary("%", o, self)
    def __neg__(self): return binary("-", Const(0, self.dtype), self)
    def __lt__(self, o): return binary("<", self, o)
    def __le__(self, o): return binary("<=", self, o)
    def __gt__(self, o): return binary(">", self, o)
    def __ge__(self, o): return binary(">=", self, o)
    def __eq__(self, o): return binary("==", self, o)      # noqa: E704
    def __ne__(self, o): return binary("!=", self, o)
    def __and__(self, o): return binary("&&", self, o)
    def __rand__(self, o): return binary("&&", o, self)
    def __or__(self, o): return binary("||", self, o)
    def __ror__(self, o): return binary("||", o, self)
    __hash__ = object.__hash__

    def __bool__(self):
        fail(f"{self} has no truth value at declaration time: use & and | (or te.all / te.any) "
             "to combine conditions and te.if_then_else to choose")

    def astype(self, dtype) -> "Expr":
        return cast(dtype, self)

    @property
    def args(self) -> tuple:
        return ()

    def with_args(self, args) -> "Expr":
        return self

    def key(self) -> tuple:
        """A structural identity (variables by object identity)."""
        return (type(self).__name__, self.dtype, *(a.key() for a in self.args))


class Const(Expr):
    __slots__ = ("value", "dtype")

    def __init__(self, value, dtype):
        self.dtype = check_dtype(dtype)
        if np.dtype(self.dtype).kind != "f" and not float(value).is_integer():
            fail(f"constant {value!r} is not a {self.dtype}")
        self.value = np.asarray(value).astype(self.dtype).item()

    def key(self):
        return ("Const", self.dtype, repr(self.value))

    def __str__(self):
        if self.dtype == "bool":
            return str(self.value)
        return f"{self.value!r}f" if self.dtype == "float32" else repr(self.value)


class Var(Expr):
    """An iteration variable (TVM's IterVar and its Var in one): a spatial axis of a stage or a
    reduce axis, over [lo, hi)."""
    __slots__ = ("name", "lo", "hi", "kind")
    dtype = INDEX

    def __init__(self, name: str, lo: int, hi: int, kind: str):
        self.name, self.lo, self.hi, self.kind = str(name), int(lo), int(hi), kind

    @property
    def dom(self) -> tuple:
        return (self.lo, self.hi)

    def key(self):
        return ("Var", id(self))

    def __str__(self):
        return self.name


class Read(Expr):
    __slots__ = ("tensor", "indices", "dtype")

    def __init__(self, tensor, indices):
        self.tensor, self.indices, self.dtype = tensor, tuple(indices), tensor.dtype

    @property
    def args(self):
        return self.indices

    def with_args(self, args):
        return Read(self.tensor, args)

    def key(self):
        return ("Read", id(self.tensor), *(a.key() for a in self.indices))

    def __str__(self):
        return f"{self.tensor.name}[{', '.join(map(str, self.indices))}]"


class Binary(Expr):
    __slots__ = ("op", "a", "b", "dtype")

    def __init__(self, op, a, b, dtype):
        self.op, self.a, self.b, self.dtype = op, a, b, dtype

    @property
    def args(self):
        return (self.a, self.b)

    def with_args(self, args):
        return Binary(self.op, args[0], args[1], self.dtype)

    def key(self):
        return ("Binary", self.op, self.a.key(), self.b.key())

    def __str__(self):
        if self.op in ("//", "%"):
            return f"{'floordiv' if self.op == '//' else 'floormod'}({self.a}, {self.b})"
        sep = self.op if self.op in ("*", "/") else f" {self.op} "
        return f"({self.a}{sep}{self.b})"


class Call(Expr):
    __slots__ = ("fn", "operands", "dtype")

    def __init__(self, fn, operands, dtype):
        self.fn, self.operands, self.dtype = fn, tuple(operands), dtype

    @property
    def args(self):
        return self.operands

    def with_args(self, args):
        return Call(self.fn, args, self.dtype)

    def key(self):
        return ("Call", self.fn, *(a.key() for a in self.operands))

    def __str__(self):
        return f"{self.fn}({', '.join(map(str, self.operands))})"


class Select(Expr):
    __slots__ = ("cond", "a", "b", "dtype")

    def __init__(self, cond, a, b):
        self.cond, self.a, self.b, self.dtype = cond, a, b, a.dtype

    @property
    def args(self):
        return (self.cond, self.a, self.b)

    def with_args(self, args):
        return Select(*args)

    def __str__(self):
        return f"if_then_else({self.cond}, {self.a}, {self.b})"


class Cast(Expr):
    __slots__ = ("a", "dtype")

    def __init__(self, dtype, a):
        self.dtype, self.a = dtype, a

    @property
    def args(self):
        return (self.a,)

    def with_args(self, args):
        return Cast(self.dtype, args[0])

    def __str__(self):
        return f"{self.dtype}({self.a})"


class Reduce(Expr):
    """A commutative reduction ("sum", "max", "min") of `source` over `axes`; only ever the whole
    body of a stage (as in TVM), so a stage is a loop nest with one accumulator."""
    __slots__ = ("op", "source", "axes", "dtype")

    def __init__(self, op, source, axes):
        self.op, self.source, self.axes, self.dtype = op, source, tuple(axes), source.dtype

    @property
    def args(self):
        return (self.source,)

    def with_args(self, args):
        return Reduce(self.op, args[0], self.axes)

    def key(self):
        return ("Reduce", self.op, self.source.key(), *(id(a) for a in self.axes))

    def __str__(self):
        return str(self.source)


def wrap(x, like: str | None = None) -> Expr:
    """An operand as an expression: Python numbers become constants of the other operand's dtype."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, np.bool_)):
        return Const(bool(x), "bool")
    if isinstance(x, (int, np.integer)):
        return Const(int(x), like if like and like != "bool" else INDEX)
    if isinstance(x, (float, np.floating)):
        if like is not None and np.dtype(like).kind != "f":
            fail(f"the float constant {float(x)!r} meets a {like} expression: cast one with te.cast")
        return Const(float(x), like or "float32")
    fail(f"{type(x).__name__} {x!r} is not an expression, a tensor element or a number")


def binary(op: str, a, b) -> Expr:
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        fail(f"no expression in ({a!r} {op} {b!r})")
    a = wrap(a, b.dtype if isinstance(b, Expr) else None)
    b = wrap(b, a.dtype)
    if a.dtype != b.dtype:
        fail(f"cannot combine {a.dtype} and {b.dtype} in ({a} {op} {b}): cast one with te.cast or .astype")
    dt = a.dtype
    if op in LOGIC:
        if dt != "bool":
            fail(f"{op} takes conditions (comparisons), not {dt}: ({a} {op} {b})")
        return Binary(op, a, b, "bool")
    if dt == "bool" and op not in ("==", "!="):
        fail(f"arithmetic on conditions: ({a} {op} {b})")
    if op == "/" and np.dtype(dt).kind != "f":
        fail(f"'/' of integers ({a} / {b}): use // (floor division) for indices, or cast to a float")
    if op in ("//", "%") and np.dtype(dt).kind == "f":
        fail(f"'{op}' of floats ({a} {op} {b}): floor division and modulo are for integer indices")
    return Binary(op, a, b, "bool" if op in CMP else dt)


def call(fn: str, *operands) -> Expr:
    """A call of one of the fixed functions FUNCS (te.exp, te.erf, ...)."""
    if not isinstance(fn, str) or fn not in FUNCS:
        fail(f"unknown function {fn!r} (known: {', '.join(sorted(FUNCS))})")
    if len(operands) != FUNCS[fn]:
        fail(f"{fn} takes {FUNCS[fn]} argument(s), got {len(operands)}")
    like = next((o.dtype for o in operands if isinstance(o, Expr)), None)
    ops = [wrap(o, like) for o in operands]
    if len({o.dtype for o in ops}) > 1:
        fail(f"{fn} of {' and '.join(o.dtype for o in ops)}: cast one with te.cast")
    dt = ops[0].dtype
    if fn not in ("max", "min", "abs") and np.dtype(dt).kind != "f":
        fail(f"{fn} of a {dt} value {ops[0]}: cast it to a float first")
    if dt == "bool":
        fail(f"{fn} of a condition {ops[0]}")
    return Call(fn, ops, dt)


def cast(dtype, x) -> Expr:
    dt = check_dtype(dtype)
    x = wrap(x)
    return x if x.dtype == dt else Cast(dt, x)


def if_then_else(cond, a, b) -> Expr:
    cond = wrap(cond)
    if cond.dtype != "bool":
        fail(f"the condition of if_then_else is {cond.dtype}, not a comparison: {cond}")
    like = a.dtype if isinstance(a, Expr) else (b.dtype if isinstance(b, Expr) else None)
    a, b = wrap(a, like), wrap(b, like)
    if a.dtype != b.dtype:
        fail(f"if_then_else's branches are {a.dtype} and {b.dtype}: cast one with te.cast")
    return Select(cond, a, b)


def walk(e: Expr):
    """Every node of `e`, parents first."""
    stack = [e]
    while stack:
        n = stack.pop()
        yield n
        stack.extend(reversed(n.args))


def substitute(e: Expr, fn) -> Expr:
    """`e` rebuilt bottom-up, each node replaced by fn(node) when that is not None."""
    new = fn(e)
    if new is not None:
        return new
    args = e.args
    if not args:
        return e
    out = tuple(substitute(a, fn) for a in args)
    return e if all(x is y for x, y in zip(out, args)) else e.with_args(out)
