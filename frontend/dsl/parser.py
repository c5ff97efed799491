"""Parse tile-DSL source (grammar: ``tile_dsl.lark``) into the syntax tree of `ast.py`.

Syntax errors become `DslSyntaxError`: ``file:line:col: syntax error: expected <words>,
found <token>`` followed by the source line and a caret under the column.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import cast

import lark
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken
from lark.indenter import Indenter

from tilecc.errors import DslSyntaxError, TileccError
from tilecc.frontend.dsl import ast as A


class _Indent(Indenter):
    NL_type = "_NL"  # pyright: ignore[reportAssignmentType] (lark's stub declares abstract properties)
    OPEN_PAREN_types = ["LPAR", "LSQB"]  # pyright: ignore[reportAssignmentType] (lark's stub declares abstract properties)
    CLOSE_PAREN_types = ["RPAR", "RSQB"]  # pyright: ignore[reportAssignmentType] (lark's stub declares abstract properties)
    INDENT_type = "_INDENT"  # pyright: ignore[reportAssignmentType] (lark's stub declares abstract properties)
    DEDENT_type = "_DEDENT"  # pyright: ignore[reportAssignmentType] (lark's stub declares abstract properties)
    tab_len = 4  # pyright: ignore[reportAssignmentType] (lark's stub declares abstract properties)


@functools.cache
def _parser() -> lark.Lark:
    text = resources.files("tilecc.frontend.dsl").joinpath("tile_dsl.lark").read_text(encoding="utf-8")
    return lark.Lark(text, parser="lalr", postlex=_Indent(), propagate_positions=True, maybe_placeholders=True)


# what a terminal means, in words (for "expected ...")
_WORDS = {
    "NAME": "a name", "NUMBER": "a number", "DTYPE": "a dtype (f32, bf16, f16, i32)",
    "LPAR": "'('", "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "COLON": "':'", "COMMA": "','",
    "EQUAL": "'='", "AUGOP": "'+=', '-=', '*=' or '/='", "CMPOP": "a comparison", "ADDOP": "'+' or '-'",
    "MULOP": "'*', '/' or '//'", "MINUS": "'-'", "DOT": "'.'", "__ANON_0": "'->'", "_NL": "a new line",
    "_INDENT": "an indented block", "_DEDENT": "the end of the block", "KERNEL": "'kernel'",
    "FOR": "'for'", "IN": "'in'", "PASS": "'pass'", "$END": "the end of the file", "POW": "'**'",
}


def _words(expected: set[str]) -> str:
    if {"NAME", "NUMBER", "LPAR"} <= expected:  # anywhere an expression may start
        return "an index or an expression" if "COLON" in expected else "an expression"
    names = sorted({_WORDS.get(t, t.lower().strip("_")) for t in expected})
    if len(names) > 6:
        names = names[:6] + ["..."]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def excerpt(source: str, line: int, col: int) -> str:
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return ""
    text = lines[line - 1]
    return f"    {text}\n    {' ' * (col - 1)}^"


def _syntax(filename: str, source: str, line: int, col: int, what: str) -> DslSyntaxError:
    return DslSyntaxError(f"{filename}:{line}:{col}: syntax error: {what}", (filename, line, col),
                          excerpt(source, line, col))


def parse(source: str, filename: str = "<string>") -> list[A.Kernel]:
    """The kernels of `source`, or `DslSyntaxError`."""
    text = source if source.endswith("\n") else source + "\n"
    try:
        tree = _parser().parse(text)
    except UnexpectedToken as e:
        tok = e.token
        found = "the end of the file" if tok.type == "$END" else (
            "a new line" if tok.type == "_NL" else (
                "an unexpected indent" if tok.type == "_INDENT" else (
                    "the end of the block" if tok.type == "_DEDENT" else repr(str(tok)))))
        line, col = (e.line, e.column) if e.line and e.line > 0 else _end(text)
        raise _syntax(filename, source, line, col, f"expected {_words(set(e.expected))}, found {found}") from None
    except UnexpectedCharacters as e:
        ch = text[e.pos_in_stream] if e.pos_in_stream < len(text) else ""
        raise _syntax(filename, source, e.line, e.column, f"unexpected character {ch!r}") from None
    except UnexpectedEOF as e:
        line, col = _end(text)
        expected = _words(set(e.expected))
        raise _syntax(filename, source, line, col, f"unexpected end of file, expected {expected}") from None
    except UnexpectedInput as e:  # pragma: no cover - the three above are all lark raises
        raise _syntax(filename, source, e.line, e.column, str(e).splitlines()[0]) from None
    except lark.exceptions.LarkError:  # the indenter: a dedent to an unknown level
        line, col = _bad_dedent(text)
        raise _syntax(filename, source, line, col, "unindent does not match any outer indentation level") from None
    # the start rule's children are the kernel trees (its tokens are filtered out)
    kernels = [_Build(filename).kernel(cast(lark.Tree, k)) for k in tree.children]
    for k in kernels:
        k.source, k.filename = source, filename
    return kernels


def load_kernels(source: str, filename: str = "<string>", name: str | None = None) -> list[A.Kernel]:
    """The kernels of `source`; only the one called `name` when given (an error naming
    the kernels found when there is none)."""
    kernels = parse(source, filename)
    if name is None:
        return kernels
    found = [k for k in kernels if k.name == name]
    if not found:
        raise TileccError(f"{filename}: no kernel named '{name}' (found: {', '.join(k.name for k in kernels)})")
    return found


def _end(text: str) -> tuple[int, int]:
    lines = text.rstrip("\n").splitlines() or [""]
    return len(lines), len(lines[-1]) + 1


def _bad_dedent(text: str) -> tuple[int, int]:
    levels = [0]
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        n = len(line) - len(line.lstrip())
        if n > levels[-1]:
            levels.append(n)
            continue
        while levels and n < levels[-1]:
            levels.pop()
        if not levels or levels[-1] != n:
            return i, n + 1
    return _end(text)


def _pos(node) -> A.Pos:
    meta = node.meta if isinstance(node, lark.Tree) else None
    if meta is not None and not meta.empty:
        return A.Pos(meta.line, meta.column)
    if isinstance(node, lark.Token):
        return A.Pos(node.line or 0, node.column or 0)
    return A.Pos(0, 0)


class _Build:
    def __init__(self, filename: str):
        self.filename = filename

    def kernel(self, t: lark.Tree) -> A.Kernel:
        name, *params, results, suite = t.children
        params = [self.param(p) for p in params if p is not None]
        if results.data == "single_result":
            res = [A.Param(_pos(results), "out", self.ttype(results.children[0]))]
        else:
            res = [self.param(p) for p in results.children]
        return A.Kernel(_pos(name), str(name), params, res, self.suite(suite))

    def param(self, t: lark.Tree) -> A.Param:
        name, tt = t.children
        return A.Param(_pos(name), str(name), self.ttype(tt))

    def ttype(self, t: lark.Tree) -> A.TensorType:
        dtype, *dims = t.children
        return A.TensorType(_pos(dtype), str(dtype), [self.dim(d) for d in dims if d is not None])

    def dim(self, d: lark.Tree) -> str | int | A.Expr:
        e = self.expr(d)
        if isinstance(e, A.Name):
            return e.id
        if isinstance(e, A.Number) and isinstance(e.value, int):
            return e.value
        return e

    def suite(self, t: lark.Tree) -> list[A.Stmt]:
        return [self.stmt(s) for s in t.children]

    def stmt(self, t: lark.Tree) -> A.Stmt:
        p, c = _pos(t), t.children
        if t.data == "for_stmt":
            it = self.expr(c[1])
            assert isinstance(it, A.Call)
            return A.For(p, str(c[0]), it, self.suite(c[2]))
        if t.data == "assign":
            return A.Assign(p, str(c[0]), self.expr(c[1]))
        if t.data == "aug_assign":
            return A.AugAssign(p, str(c[0]), str(c[1])[0], self.expr(c[2]))
        if t.data == "aug_store":
            return A.AugStore(p, str(c[0]), [self.expr(i) for i in c[1:-2]], str(c[-2])[0], self.expr(c[-1]))
        if t.data == "store":
            return A.Store(p, str(c[0]), [self.expr(i) for i in c[1:-1]], self.expr(c[-1]))
        if t.data == "pass_stmt":
            return A.Pass(p)
        raise AssertionError(t.data)  # pragma: no cover

    def expr(self, t) -> A.Expr:
        p = _pos(t)
        if isinstance(t, lark.Token):  # pragma: no cover - every atom is a tree
            raise AssertionError(t)
        c = t.children
        d = t.data
        if d == "number":
            s = str(c[0])
            return A.Number(p, int(s) if s.isdigit() else float(s))
        if d == "name":
            return A.Name(p, str(c[0]))
        if d == "attr":
            return A.Attr(p, self.expr(c[0]), str(c[1]))
        if d == "full_slice":
            return A.FullSlice(p)
        if d == "range_slice":
            return A.RangeSlice(p, self.expr(c[0]), self.expr(c[1]))
        if d == "subscript":
            return A.Subscript(p, str(c[0]), [self.expr(i) for i in c[1:]])
        if d == "type_expr":
            return A.TypeExpr(p, str(c[0]), [self.expr(x) for x in c[1:] if x is not None])
        if d == "cast":
            return A.Cast(p, str(c[0]), self.expr(c[1]))
        if d == "neg":
            return A.Neg(p, self.expr(c[0]))
        if d == "power":
            return A.BinOp(p, "**", self.expr(c[0]), self.expr(c[1]))
        if d in ("sum", "product", "compare"):
            out = self.expr(c[0])
            for op, rhs in zip(c[1::2], c[2::2]):
                out = A.BinOp(p, str(op), out, self.expr(rhs))
            return out
        if d == "call":
            args: list[A.Expr] = []
            kwargs: dict[str, A.Expr] = {}
            for a in c[1:]:
                if a is None:
                    continue
                if isinstance(a, lark.Tree) and a.data == "kwarg":
                    kwargs[str(a.children[0])] = self.expr(a.children[1])
                else:
                    args.append(self.expr(a))
            return A.Call(p, str(c[0]), args, kwargs)
        raise AssertionError(d)  # pragma: no cover
