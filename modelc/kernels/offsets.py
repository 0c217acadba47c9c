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
from dataclasses import dataclass, field

_HEADS = ("for ", "while ", "if ", "elif ", "else", "with ")


@dataclass
class _Node:
    line: int                              # index into the body's lines
    children: list = field(default_factory=list)


def _tree(lines: list) -> list:
    """The body's lines as nested blocks by indentation (blank lines dropped)."""
    root: list = []
    stack = [(-1, root)]
    for k, ln in enumerate(lines):
        text = ln.strip()
        if not text or text.startswith("#"):
            continue
        ind = len(ln) - len(ln.lstrip(" "))
        while stack[-1][0] >= ind:
            stack.pop()
        node = _Node(k)
        stack[-1][1].append(node)
        if text.endswith(":") and text.startswith(_HEADS):
            stack.append((ind, node.children))
    return root


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


def _names(key) -> set:
    names = set(key[0])
    for a, _ in key[1]:
        names |= {n.id for n in ast.walk(ast.parse(a, mode="eval")) if isinstance(n, ast.Name)}
    return names


def _assigned(tree: ast.AST) -> set:
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
    return out


class _Pass:
    def __init__(self, lines: list):
        self.lines = list(lines)
        self.stmts: dict = {}              # line -> parsed statement (only those rewritten)
        self.inserts: dict = {}            # line -> base definitions to put before it
        self.count = 0

    def parse(self, k):
        if k not in self.stmts:
            try:
                self.stmts[k] = ast.parse(self.lines[k].strip()).body[0]
            except SyntaxError:
                self.stmts[k] = None
        return self.stmts[k]

    def subtree(self, node: _Node, uses: list, pos: int, assigned: set, loops: bool):
        """Offsets (uses) and assigned names of a block element and what it holds; statements in
        loops count for assignments only (their loop is a block of its own)."""
        text = self.lines[node.line].strip()
        if node.children:
            is_loop = text.startswith(("for ", "while "))
            if is_loop:
                head = text[:-1] + ": pass"
                try:
                    assigned |= _assigned(ast.parse(head))
                except SyntaxError:
                    assigned.add(None)
            for ch in node.children:
                self.subtree(ch, uses, pos, assigned, loops or is_loop)
            return
        st = self.parse(node.line)
        if st is None:
            assigned.add(None)              # unknown: nothing may move across it
            return
        assigned |= _assigned(st)
        if loops:
            return
        for n in ast.walk(st):
            if isinstance(n, ast.Subscript):
                r = _offset(n.slice)
                if r is not None:
                    uses.append((pos, node.line, n, *r))

    def block(self, nodes: list):
        uses, assigned = [], []
        for pos, node in enumerate(nodes):
            names: set = set()
            self.subtree(node, uses, pos, names, False)
            assigned.append(names)
        groups: dict = {}
        for u in uses:
            groups.setdefault(u[3], []).append(u)
        indent = None
        for key, us in groups.items():
            if len(us) < 2:
                continue
            p0, p1 = min(u[0] for u in us), max(u[0] for u in us)
            touched = set().union(*assigned[p0:p1 + 1])
            if None in touched or touched & _names(key):
                continue
            first = nodes[p0].line
            ln = self.lines[first]
            indent = ln[:len(ln) - len(ln.lstrip(" "))]
            name = f"b__{self.count}"
            self.count += 1
            self.inserts.setdefault(first, []).append(f"{indent}{name} = {_base(key)}")
            for _, _, sub, _, const in us:
                text = name if const == 0 else f"{name} + np.uintp({const})"
                sub.slice = ast.parse(text, mode="eval").body
            for _, line, _, _, _ in us:
                self.stmts[line].modified = True
        for node in nodes:                 # loops (and ifs' loops) are blocks of their own
            self.nested(node)

    def nested(self, node: _Node):
        if not node.children:
            return
        if self.lines[node.line].strip().startswith(("for ", "while ")):
            self.block(node.children)
        else:
            for ch in node.children:
                self.nested(ch)

    def result(self) -> list:
        out = []
        for k, ln in enumerate(self.lines):
            out += self.inserts.get(k, [])
            st = self.stmts.get(k)
            if st is not None and getattr(st, "modified", False):
                ln = ln[:len(ln) - len(ln.lstrip(" "))] + ast.unparse(st)
            out.append(ln)
        return out


def share_offsets(lines: list) -> list:
    """`lines` (a kernel body, 4-space indented) with offsets that differ by a constant sharing
    one named base per block."""
    p = _Pass(lines)
    p.block(_tree(p.lines))
    return p.result()
