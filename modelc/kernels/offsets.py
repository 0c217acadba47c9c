"""Offsets that differ by a constant, computed once: a pass over a kernel body's source.

Why: templates unroll register tiles, and each unrolled statement writes its whole offset -
`out0[np.uintp(n * 215296 + (ko0 + blk) * 53824 + (oy + 2 + 1) * 928 + (ox + 3 + 1) * 16 + jj)]`
sixteen times over with other constants. numba types and lowers every operation of every copy
(about 10 ms an offset), LLVM then folds them back into one address plus constants: a 14 x 14
Winograd kernel spent a quarter of its compile on its store offsets alone. Here the offsets of a
block's statements that differ only by a constant share one base, named before the first of
them (`b__3 = np.uintp(n * 215296 + ...)`), and each becomes `b__3 + np.uintp(K)` (the literal
is hoisted by `template.hoist_literals`).

The rewrite is the same arithmetic modulo 2**64 (an offset is an unsigned sum) and keeps the
statements' order; it is done only where it is sure: the offset is a sum of unsigned names and
`np.uintp(...)` of integer arithmetic over names, the statements sit in one block (not across a
loop), and no name it reads is assigned between the first and the last of them. Anything else
is left as written.
"""
from __future__ import annotations

import ast
import collections
import functools


def _linear(node) -> tuple[dict, int] | None:
    """Integer arithmetic over names as ({atom: coefficient}, constant); products of two
    non-constants, // and % are atoms (named by their text)."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return {}, node.value
    if isinstance(node, ast.Name):
        return {node.id: 1}, 0
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        r = _linear(node.operand)
        if r is None:
            return None
        s = -1 if isinstance(node.op, ast.USub) else 1
        return {a: s * c for a, c in r[0].items()}, s * r[1]
    if not isinstance(node, ast.BinOp):
        return None
    left, right = _linear(node.left), _linear(node.right)
    if left is None or right is None:
        return None
    if isinstance(node.op, (ast.Add, ast.Sub)):
        s = 1 if isinstance(node.op, ast.Add) else -1
        atoms = dict(left[0])
        for a, c in right[0].items():
            atoms[a] = atoms.get(a, 0) + s * c
        return atoms, left[1] + s * right[1]
    if isinstance(node.op, ast.Mult) and (not left[0] or not right[0]):
        (atoms, c0), k = (right, left[1]) if not left[0] else (left, right[1])
        return {a: c * k for a, c in atoms.items()}, c0 * k
    if isinstance(node.op, (ast.Mult, ast.FloorDiv, ast.Mod)):
        return {f"({ast.unparse(node)})": 1}, 0
    return None


def _is_uintp(node) -> bool:
    f = node.func if isinstance(node, ast.Call) else None
    return (isinstance(f, ast.Attribute) and f.attr == "uintp" and isinstance(f.value, ast.Name)
            and f.value.id == "np" and len(node.args) == 1 and not node.keywords)


def _offset(node) -> tuple | None:
    """(key, constant) of an unsigned offset: the key is what the offset adds besides the constant."""
    terms, todo = [], [node]
    while todo:
        t = todo.pop()
        if isinstance(t, ast.BinOp) and isinstance(t.op, ast.Add):
            todo += [t.left, t.right]
        else:
            terms.append(t)
    unsigned, signed, const, calls = [], {}, 0, 0
    for t in terms:
        if isinstance(t, ast.Name):
            unsigned.append(t.id)
        elif _is_uintp(t):
            r = _linear(t.args[0])
            if r is None:
                return None
            calls += 1
            for a, c in r[0].items():
                signed[a] = signed.get(a, 0) + c
            const += r[1]
        else:
            return None
    key = (tuple(sorted(unsigned)), tuple(sorted((a, c) for a, c in signed.items() if c)))
    if not calls or not (key[0] or key[1]):
        return None
    return key, const


def _base(key) -> str:
    unsigned, signed = key
    parts = list(unsigned)
    if signed:
        terms = []
        for a, c in signed:
            t = a if c in (1, -1) else f"{a} * {abs(c)}"
            terms.append(("- " if c < 0 else "+ ") + t)
        s = " ".join(terms)
        parts.append(f"np.uintp({s[2:] if s.startswith('+ ') else '-' + s[2:]})")
    return " + ".join(parts)


@functools.lru_cache(maxsize=4096)
def _names(key) -> frozenset:
    names = set(key[0])
    for a, _ in key[1]:
        names |= {n.id for n in ast.walk(ast.parse(a, mode="eval")) if isinstance(n, ast.Name)}
    return frozenset(names)


def _assigned(st) -> set:
    """Names a simple statement binds (the body holds no `:=`: share_offsets checks)."""
    if isinstance(st, ast.Assign):
        targets = st.targets
    elif isinstance(st, (ast.AugAssign, ast.AnnAssign, ast.For)):
        targets = [st.target]
    else:
        return set()
    out: set = set()
    for t in targets:
        _bound(t, out)
    return out


def _children(st) -> list:
    """The statements a compound statement holds; an if/elif chain's branches are walked rather
    than recursed into: a concat of 1,500 parts (an LSTM's steps written out) is a chain that deep,
    past Python's recursion limit."""
    out = list(st.body)
    while isinstance(st, ast.If) and len(st.orelse) == 1 and isinstance(st.orelse[0], ast.If):
        st = st.orelse[0]
        out += st.body
    return out + list(st.orelse)


def _bound(target, out: set):
    """The names an assignment target binds (a subscript or attribute binds none)."""
    if isinstance(target, ast.Name):
        out.add(target.id)
    elif isinstance(target, (ast.Tuple, ast.List)):
        for e in target.elts:
            _bound(e, out)
    elif isinstance(target, ast.Starred):
        _bound(target.value, out)


_LEAVES = (ast.Name, ast.Constant, ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop)


def _subscripts(node) -> list:
    """The subscripts in a statement, in `ast.walk`'s order (breadth first), without visiting
    the leaves that cannot hold one: with ast.walk's generic field iteration this pass was most of
    writing a kernel's source (900 logged candidates: 15.2 s, 12.9 s with this walk)."""
    out, todo = [], collections.deque([node])
    while todo:
        n = todo.popleft()
        if isinstance(n, ast.Subscript):
            out.append(n)
        for f in n._fields:
            v = getattr(n, f, None)
            if isinstance(v, list):
                todo.extend(x for x in v if isinstance(x, ast.AST) and not isinstance(x, _LEAVES))
            elif isinstance(v, ast.AST) and not isinstance(v, _LEAVES):
                todo.append(v)
    return out


_SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Pass, ast.Continue, ast.Break)


class _Pass:
    """One parse of the body; statements rewritten in place, bases inserted before lines."""

    def __init__(self, lines: list):
        self.lines = list(lines)
        self.rewrite: dict = {}             # line -> statement to write again
        self.inserts: dict = {}             # line -> base definitions to put before it
        self.count = 0
        self.bound: dict = {}               # id(statement) -> names it binds

    def stores(self, st) -> set:
        """Names a statement and what it holds bind (None: something that may do anything)."""
        key = id(st)
        if key not in self.bound:
            if isinstance(st, (ast.For, ast.While, ast.If)):
                out = _assigned(st)
                for ch in _children(st):
                    out |= self.stores(ch)
            elif isinstance(st, _SIMPLE):
                out = _assigned(st)
            else:
                out = {None}
            self.bound[key] = out
        return self.bound[key]

    def element(self, st, uses: list, pos: int):
        """The offsets in a block element (loops inside it are blocks of their own)."""
        if isinstance(st, ast.If):
            for ch in _children(st):
                self.element(ch, uses, pos)
            return
        if not isinstance(st, (ast.Assign, ast.AugAssign, ast.Expr)) or st.end_lineno != st.lineno \
                or "np.uintp(" not in self.lines[st.lineno - 1]:
            return
        for n in _subscripts(st):
            r = _offset(n.slice)
            if r is not None:
                uses.append((pos, st, n, *r))

    def block(self, stmts: list):
        uses = []
        for pos, st in enumerate(stmts):
            self.element(st, uses, pos)
        assigned = [self.stores(st) for st in stmts]
        groups: dict = {}
        for u in uses:
            groups.setdefault(u[3], []).append(u)
        for key, us in groups.items():
            if len(us) < 2:
                continue
            p0, p1 = min(u[0] for u in us), max(u[0] for u in us)
            touched = set().union(*assigned[p0:p1 + 1])
            if None in touched or touched & _names(key):
                continue
            first = stmts[p0]
            name = f"b__{self.count}"
            self.count += 1
            self.inserts.setdefault(first.lineno - 1, []).append(
                f"{self.indent(first)}{name} = {_base(key)}")
            for _, st, sub, _, const in us:
                sub.slice = ast.Name(name, ast.Load())
                if const:
                    k = ast.Call(ast.Attribute(ast.Name("np", ast.Load()), "uintp", ast.Load()),
                                 [ast.Constant(const)], [])
                    sub.slice = ast.BinOp(sub.slice, ast.Add(), k)
                self.rewrite[st.lineno - 1] = st
        for st in stmts:                    # loops, also inside ifs, are blocks of their own
            self.nested(st)

    def nested(self, st):
        if isinstance(st, (ast.For, ast.While)):
            self.block(st.body)
            if st.orelse:
                self.block(st.orelse)
        elif isinstance(st, ast.If):
            for ch in _children(st):
                self.nested(ch)

    def indent(self, st) -> str:
        ln = self.lines[st.lineno - 1]
        return ln[:len(ln) - len(ln.lstrip(" "))]

    def result(self) -> list:
        out = []
        for k, ln in enumerate(self.lines):
            out += self.inserts.get(k, [])
            st = self.rewrite.get(k)
            out.append(ln if st is None else self.indent(st) + ast.unparse(st))
        return out


def share_offsets(lines: list) -> list:
    """`lines` (a kernel body, one statement or block header a line) with offsets that differ by
    a constant sharing one named base per block."""
    text = "\n".join(lines)
    lines = text.split("\n")                # a line each, as the parser numbers them
    if ":=" in text:
        return lines
    try:
        tree = ast.parse(text)
    except (SyntaxError, RecursionError):
        return lines                        # numba will say what is wrong with it
    p = _Pass(lines)
    p.block(tree.body)
    return p.result()
