"""Source ranges of the few nodes a lint reports, without a pass over the whole file.

LibCST's :class:`~libcst.metadata.PositionProvider` finds positions by
generating the code of the whole module and counting lines and columns as it
goes; through ``MetadataWrapper`` that cost more than the parse itself. A
finding needs the range of one node, so :func:`node_ranges` generates only
the innermost statement around each reported node:

1. one walk of the tree (:mod:`torchgradlint.analysis.tree`, no code
   generation) finds each wanted node's chain of enclosing statements;
2. the chain is followed down through the bodies of ``def``, ``class``,
   ``for``, ``while``, ``with``, ``if`` and ``try`` blocks to the innermost
   statement;
3. LibCST's position pass runs on that statement alone, with the indentation
   of its enclosing blocks, and stops once the wanted nodes have their
   ranges; its lines are shifted by the statement's place in the file: the
   one line where the generated text starts in the source, or, when that
   text starts several lines, the line Python's own :mod:`ast` of the source
   gives the statement (statement lists correspond one to one, a line of
   ``;``-separated simple statements counting once per statement).

The result is checked, not trusted: the generated text must equal the
source at the place computed, character for character (the positions LibCST
reports are a function of that text). Anything unexpected (a syntax
Python's ``ast`` of this interpreter does not accept, a wanted node outside
every statement, a text mismatch) falls back to the whole-module pass
(:func:`module_ranges`), so the answer is always LibCST's own.
"""

from __future__ import annotations

import ast
import bisect
from typing import Mapping, Optional

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider
from libcst.metadata.position_provider import PositionProvidingCodegenState

from .analysis.tree import iter_children
from .lines import line_starts

Ranges = Mapping[cst.CSTNode, CodeRange]


class _AllFound(Exception):
    """Raised inside the position pass once every wanted node has its range."""


_NO_RANGE = CodeRange((1, 0), (1, 0))


class _WantedRanges(dict):
    """The provider's node -> range table; stops the pass (:class:`_AllFound`)
    as soon as every wanted node is in it. A node's first range is final
    (the provider writes the syntactic range, then never overwrites it), and
    a node is written when its code is complete, so the nodes still open when
    the pass stops are none of the wanted ones: while the stop unwinds them,
    their lookups get a placeholder and their writes are ignored."""

    def __init__(self, wanted: "set[cst.CSTNode]") -> None:
        super().__init__()
        self.missing = set(wanted)
        self.done = not self.missing

    def __setitem__(self, node: cst.CSTNode, rng: CodeRange) -> None:
        if self.done:
            return
        super().__setitem__(node, rng)
        if node in self.missing:
            self.missing.discard(node)
            if not self.missing:
                self.done = True
                raise _AllFound

    def __missing__(self, node: cst.CSTNode) -> CodeRange:
        if self.done:
            return _NO_RANGE
        raise KeyError(node)


def _generate(node: cst.CSTNode, module: cst.Module, wanted: "set[cst.CSTNode]",
              indents: "list[str]") -> "tuple[_WantedRanges, str]":
    """Run the position pass over ``node`` (with ``indents``, the
    indentation of its enclosing blocks) until every ``wanted`` node has
    its range: the ranges (lines counted from 1 at ``node``'s first line) and
    the text generated so far."""
    provider = PositionProvider()
    table = _WantedRanges(wanted)
    provider._computed = table
    state = PositionProvidingCodegenState(default_indent=module.default_indent,
                                          default_newline=module.default_newline, provider=provider)
    state.indent_tokens = list(indents)
    try:
        node._codegen(state)
    except _AllFound:
        pass
    return table, "".join(state.tokens)


def module_ranges(module: cst.Module, wanted: "set[cst.CSTNode]") -> Ranges:
    """The :class:`~libcst.metadata.CodeRange` (``PositionProvider``'s) of
    every node in ``wanted``: one position pass over the module, run directly
    and stopped after the last wanted node (through ``MetadataWrapper.resolve``
    the whole tree's positions cost about twice as much: the wrapper adds a
    visit of the whole tree). Falls back to the wrapper should LibCST's
    provider internals change."""
    try:
        return _generate(module, module, wanted, [])[0]
    except AttributeError:  # pragma: no cover - a LibCST without these internals
        return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)


# Compound statements whose ``body`` block the search descends into, and the
# ``ast`` classes they correspond to.
_DESCEND: dict[type, tuple[type, ...]] = {
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.If: (ast.If,),
    cst.Try: (ast.Try,),
}
# Every compound statement and its ``ast`` classes (any other LibCST
# statement is a line of simple statements).
_CST_COMPOUND: dict[type, tuple[type, ...]] = dict(_DESCEND)
for _cst_name, _ast_name in (("Match", "Match"), ("TryStar", "TryStar")):  # Python 3.10+, 3.11+
    if hasattr(ast, _ast_name):
        _CST_COMPOUND[getattr(cst, _cst_name)] = (getattr(ast, _ast_name),)
_AST_COMPOUND = tuple({c for kinds in _CST_COMPOUND.values() for c in kinds})


class _Mismatch(Exception):
    """The fast path met something it does not handle: use the whole-module pass."""


def _ancestors(module: cst.Module, wanted: "set[cst.CSTNode]") -> "dict[cst.CSTNode, list[cst.CSTNode]]":
    """Each wanted node's chain of ancestors, the module first (one walk,
    iterative, stopped once every wanted node is seen)."""
    found: dict[cst.CSTNode, list[cst.CSTNode]] = {}
    ids = {id(n) for n in wanted}  # ``id`` in C: a node's own ``__hash__`` is a Python call
    stack = [(module, iter_children(module))]
    while stack:
        child = next(stack[-1][1], None)
        if child is None:
            stack.pop()
            continue
        if id(child) in ids and child not in found:
            found[child] = [n for n, _ in stack]
            if len(found) == len(wanted):
                break
        stack.append((child, iter_children(child)))
    return found


def _ast_at(stmts: "tuple[cst.BaseStatement, ...] | list", k: int, ast_body: list) -> ast.stmt:
    """The ``ast`` statement of ``stmts[k]``: a line of ``;``-separated
    simple statements is one LibCST statement and several ``ast`` ones.

    Raises:
        _Mismatch: the two lists do not correspond.
    """
    i = 0
    for s in stmts[:k]:
        i += len(s.body) if type(s) is cst.SimpleStatementLine else 1
    if i >= len(ast_body):
        raise _Mismatch
    node = ast_body[i]
    kinds = _CST_COMPOUND.get(type(stmts[k]))
    if kinds is None:
        if type(stmts[k]) is not cst.SimpleStatementLine or isinstance(node, _AST_COMPOUND):
            raise _Mismatch
    elif not isinstance(node, kinds):
        raise _Mismatch
    return node


def _innermost_statement(module: cst.Module, chain: "list[cst.CSTNode]"
                         ) -> "tuple[cst.BaseStatement, list[int], list[str]]":
    """The innermost statement reached from the module through statement
    bodies along ``chain`` (a wanted node's ancestors, then the node), the
    index of each statement on the way in its statement list, and the
    indentation of its enclosing blocks.

    Raises:
        _Mismatch: the chain does not start in a statement of the module.
    """
    stmts: "tuple | list" = module.body
    indexes: list[int] = []
    indents: list[str] = []
    j = 1  # chain[j] should be a statement of ``stmts``
    while True:
        if j >= len(chain):
            raise _Mismatch
        node = chain[j]
        for k, s in enumerate(stmts):
            if s is node:
                break
        else:
            raise _Mismatch
        indexes.append(k)
        body = getattr(node, "body", None)
        if (type(node) in _DESCEND and type(body) is cst.IndentedBlock and j + 2 < len(chain)
                and chain[j + 1] is body):
            indents.append(module.default_indent if body.indent is None else body.indent)
            stmts, j = body.body, j + 2
            continue
        return node, indexes, indents


def _ast_statement(module: cst.Module, tree: ast.Module, indexes: "list[int]") -> ast.stmt:
    """The ``ast`` statement reached by ``indexes`` (see
    :func:`_innermost_statement`), walking both trees' bodies together.

    Raises:
        _Mismatch: the trees do not correspond.
    """
    stmts: "tuple | list" = module.body
    ast_body = tree.body
    a: Optional[ast.stmt] = None
    for k in indexes:
        a = _ast_at(stmts, k, ast_body)
        body = getattr(stmts[k], "body", None)
        if type(body) is cst.IndentedBlock:
            stmts, ast_body = body.body, getattr(a, "body", [])
    if a is None:
        raise _Mismatch
    return a


def _only_place(source: str, starts: "list[int]", text: str) -> Optional[int]:
    """The 1-based line where ``text`` starts in ``source`` when it starts
    at the beginning of exactly one line; ``None`` otherwise."""
    line = None
    i = source.find(text)
    while i != -1:
        n = bisect.bisect_left(starts, i, 1)
        if n < len(starts) and starts[n] == i:
            if line is not None:
                return None
            line = n
        i = source.find(text, i + 1)
    return line


def node_ranges(module: cst.Module, wanted: "set[cst.CSTNode]", source: Optional[str] = None,
                tree: Optional[ast.Module] = None) -> Ranges:
    """The ``PositionProvider`` range of every node in ``wanted``.

    Args:
        module: the parsed module; its code must be ``source``.
        wanted: nodes of ``module``.
        source: the module's text; without it, the whole-module pass runs.
        tree: Python's ``ast`` of ``source`` when the caller has it (flake8
            does); else it is parsed here (about a tenth of a LibCST parse).

    Returns a mapping holding at least the wanted nodes (lines 1-based,
    columns 0-based code points, as LibCST's). Raises ``RecursionError`` for
    a tree nested too deeply for LibCST's code generation, as LibCST does.
    """
    if source is None or not wanted:
        return module_ranges(module, wanted)
    try:
        return _statement_ranges(module, wanted, source, tree)
    except (_Mismatch, SyntaxError, ValueError, MemoryError, RecursionError, AttributeError):
        return module_ranges(module, wanted)


def _statement_ranges(module: cst.Module, wanted: "set[cst.CSTNode]", source: str,
                      tree: Optional[ast.Module]) -> Ranges:
    """:func:`node_ranges`'s fast path (see the module's documentation).

    Raises:
        _Mismatch: anything it does not handle; the caller falls back.
    """
    chains = _ancestors(module, wanted)
    if len(chains) != len(wanted):
        raise _Mismatch
    groups: dict[int, tuple[cst.BaseStatement, list[int], list[str], set[cst.CSTNode]]] = {}
    for node, ancestors in chains.items():
        stmt, indexes, indents = _innermost_statement(module, ancestors + [node])
        groups.setdefault(id(stmt), (stmt, indexes, indents, set()))[3].add(node)
    starts = line_starts(source)
    out: dict[cst.CSTNode, CodeRange] = {}
    for stmt, indexes, indents, nodes in groups.values():
        decorated = bool(getattr(stmt, "decorators", ()))
        table, text = _generate(stmt, module, nodes | {stmt.name} if decorated else nodes, indents)
        line = _only_place(source, starts, text)
        if line is not None:  # the statement's text starts one line only: there it is
            shift = line - 1
        else:  # Python's ``ast`` says where it is
            if tree is None:
                tree = ast.parse(source)
            a = _ast_statement(module, tree, indexes)
            # The line the ``ast`` gives the statement: its ``def``/``class``
            # line when decorated, else its first line after its leading comments.
            first = table[stmt.name].start.line if decorated else 1 + len(stmt.leading_lines)
            shift = a.lineno - first
            if shift < 0 or shift + 1 >= len(starts) or not _matches(source, starts[shift + 1], text, module):
                raise _Mismatch
        for node in nodes:
            r = table[node]
            out[node] = CodeRange((r.start.line + shift, r.start.column), (r.end.line + shift, r.end.column))
    return out


def _matches(source: str, offset: int, text: str, module: cst.Module) -> bool:
    """Whether ``source`` holds ``text`` at ``offset``; the last statement of
    a file without a final line break is generated with one."""
    if source.startswith(text, offset):
        return True
    newline = module.default_newline
    return (not module.has_trailing_newline and text.endswith(newline)
            and offset + len(text) - len(newline) == len(source) and source.endswith(text[: -len(newline)]))
