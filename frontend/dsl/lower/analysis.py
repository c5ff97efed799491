"""Syntax-tree analyses the lowering consults before and while it emits IR.

- `names_in` / `reads_of`: the names an expression or statement reads;
- `dead_after`: whether a tile's value is dead after the current statement (transposes
  borrow a dead accumulator tile as their scratch, `transpose.dead_acc_tile`);
- `loops_bounding_inner`: the loops whose variable bounds a nested loop (unrolled);
- `lazy_zero_assigns`: the ``x = zeros(...)`` whose next mention is ``x += ...`` (their
  fill is skipped or deferred):

    acc = zeros(f32[128, 512], acc)       lazy_zero_assigns -> {id(this statement): id(zeros call)}
    for k in tiles(K, 128):
        acc += matmul(load(a[m, k]), load(b[k, n]))
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from tilecc.frontend.dsl import ast as A
from tilecc.ir import tile


def names_in(e: A.Node) -> set[str]:
    out: set[str] = set()
    stack: list[object] = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, A.Name):
            out.add(x.id)
        elif isinstance(x, A.Node):
            stack.extend(v for v in vars(x).values() if isinstance(v, (A.Node, list, dict)))
        elif isinstance(x, list):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return out


def reads_of(s: A.Stmt) -> set[str]:
    """The names statement `s` reads (an augmented assignment reads its target)."""
    names = names_in(s)
    if isinstance(s, (A.AugAssign, A.AugStore)):
        names.add(s.target)
    return names


def _first_use(stmts: Sequence[A.Stmt], name: str) -> str | None:
    """"read" if `name` may be read in `stmts` before it is overwritten, "killed" if it
    is certainly overwritten first, None if neither (not mentioned, or overwritten only
    inside loops, which may run no iteration)."""
    for s in stmts:
        if isinstance(s, A.For):
            if name in names_in(s.iter) or _first_use(s.body, name) == "read":
                return "read"
            continue
        if name in reads_of(s):
            return "read"
        if isinstance(s, A.Assign) and s.target == name:
            return "killed"
    return None


def dead_after(name: str, stack: Sequence[tuple[list[A.Stmt], int]]) -> bool:
    """Whether `name`'s value is dead after the statement at the top of `stack` (a
    (body, index) per enclosing statement, the kernel's body first): on every path it is
    overwritten or never read again. A loop body may run again, so the statements before
    the current one count too."""
    for level in range(len(stack) - 1, -1, -1):
        body, i = stack[level]
        use = _first_use(body[i + 1:], name)
        if use == "read":
            return False
        if use == "killed":
            return True
        if level > 0 and isinstance(stack[level - 1][0][stack[level - 1][1]], A.For):
            if _first_use(body[: i + 1], name) == "read":  # the next iteration
                return False
    return True


def _walk_stmts(body: list[A.Stmt]) -> Iterator[A.Stmt]:
    for s in body:
        yield s
        if isinstance(s, A.For):
            yield from _walk_stmts(s.body)


def loops_bounding_inner(body: list[A.Stmt]) -> set[int]:
    """Loops whose variable appears in the extent of a loop nested in them (unrolled)."""
    out: set[int] = set()
    for s in _walk_stmts(body):
        if not isinstance(s, A.For):
            continue
        for inner in _walk_stmts(s.body):
            if isinstance(inner, A.For) and s.var in names_in(inner.iter):
                out.add(id(s))
    return out


def lazy_zero_assigns(body: list[A.Stmt]) -> dict[int, int]:
    """`x = zeros(...)` statements whose next mention of x is ``x += ...`` (for a zeros
    in acc: ``x += matmul(...)``), x not read on the right: statement id -> zeros call id.
    In acc the first matmul's accumulate flag replaces the fill; in SRAM the first
    execution of the ``+=`` writes its value into x instead (`aug_assign`)."""
    out: dict[int, int] = {}

    def scan(block: list[A.Stmt]) -> None:
        for i, s in enumerate(block):
            if isinstance(s, A.For):
                scan(s.body)
                continue
            if not (isinstance(s, A.Assign) and isinstance(s.value, A.Call) and s.value.fn == "zeros"):
                continue
            nxt = _first_mention(block[i + 1:], s.target)
            if not (isinstance(nxt, A.AugAssign) and nxt.op == "+" and s.target not in names_in(nxt.value)):
                continue
            in_acc = any(isinstance(a, A.Name) and a.id == tile.ACC for a in s.value.args[1:])
            if not in_acc or (isinstance(nxt.value, A.Call) and nxt.value.fn in ("matmul", "matmul_t")):
                out[id(s)] = id(s.value)

    scan(body)
    return out


def _first_mention(block: list[A.Stmt], name: str) -> A.Stmt | None:
    for s in _walk_stmts(block):
        if isinstance(s, A.For):
            if name in names_in(s.iter):
                return s
            continue
        if name in names_in(s) or getattr(s, "target", None) == name:
            return s
    return None
