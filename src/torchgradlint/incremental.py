"""Incremental parsing for a long-lived host: after an edit, re-parse only the
top-level statements whose text changed.

The language server lints the same document again after every edit, and the
LibCST parse is the largest part of that lint (about 25-30 ms of a 500-line
file; ``docs/usage/editors.md``). An edit changes one statement, mostly: the
file is cut at the first line of each top-level statement (Python's ``ast``,
which the lint builds anyway, gives the lines), every piece is parsed on its
own as a module, and a piece whose text is the same as in the previous
version reuses that version's tree (LibCST nodes are immutable, so sharing
them is safe). The pieces are then joined into the one module that
:func:`libcst.parse_module` gives for the whole text: the piece's module
footer (comments and blank lines after a statement that no indented block
owns) becomes the next statement's ``leading_lines``; the first piece's
header is the file's header, the last piece's footer the file's footer.

The joined module equals the whole-file parse node for node
(``libcst.CSTNode.deep_equals``), including ``Module.default_indent``; this
is checked on every fixture, shape and dev-set file in the tests and on the
corpora by ``realcode/check_incremental_parse.py``. Where a piece could
parse differently alone, the whole text is parsed instead: text with a
carriage return (``Newline`` nodes record a newline that differs from the
file's first), a piece whose first indented block is indented differently
from the file's first (``IndentedBlock.indent`` is relative to that), text
Python's ``ast`` rejects, and any piece LibCST rejects (the whole-file parse
then raises the error with the file's own positions).

Docs: LibCST, "Parsing" and "Nodes: Module"
(https://libcst.readthedocs.io/en/latest/parser.html,
https://libcst.readthedocs.io/en/latest/nodes.html#module).
"""

from __future__ import annotations

import ast
from typing import NamedTuple, Optional

import libcst as cst

from .engine import parse_module

_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For, ast.AsyncFor, ast.While,
             ast.With, ast.AsyncWith, ast.Try, getattr(ast, "TryStar", ast.Try), ast.Match)


def _first_line(stmt: ast.stmt) -> int:
    """The 1-based line a top-level statement's text starts on (its first
    decorator's line for a decorated definition)."""
    decorators = getattr(stmt, "decorator_list", None)
    if decorators:
        return min(stmt.lineno, *(d.lineno for d in decorators))
    return stmt.lineno


def _suites(stmt: ast.stmt) -> list[list[ast.stmt]]:
    """The statement lists of a compound statement (its body, ``else``,
    ``finally``, handlers and cases)."""
    out = [getattr(stmt, name) for name in ("body", "orelse", "finalbody") if getattr(stmt, name, None)]
    out.extend(h.body for h in getattr(stmt, "handlers", ()))
    out.extend(c.body for c in getattr(stmt, "cases", ()))
    return out


def _opens_indented_block(stmt: ast.stmt, lines: list[str]) -> bool:
    """Whether a top-level statement holds an indented block (an ``INDENT``
    token: a suite whose first statement begins its own line), as opposed
    to one-line suites only (``if x: pass``)."""
    if not isinstance(stmt, _COMPOUND):
        return False
    for suite in _suites(stmt):
        first = suite[0]
        if not lines[first.lineno - 1][:first.col_offset].strip():
            return True
    return False


def _indented_gap(lines: list[str]) -> bool:
    """Whether lines between top-level statements (comments, blank lines)
    hold one that begins with whitespace. LibCST gives such lines to an
    indented block's footer, or at the end of a text can drop them or take
    their whitespace for the file's indent, so a piece never ends with one."""
    return any(line[:1].isspace() for line in lines)


class Piece(NamedTuple):
    """A piece of a file's text: ``text``; ``indented``: whether it may hold
    an ``INDENT`` token; ``parts``: for a piece that is one statement with
    an indented block, the block cut before its statements (the statement's
    head with the block's first statement, then each statement after, with
    the blank lines before it), or ``None``."""

    text: str
    indented: bool
    parts: Optional[tuple[str, ...]] = None


# Compound statements whose one suite can be cut into its statements.
_ONE_SUITE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.With, ast.AsyncWith, ast.If, ast.For,
              ast.AsyncFor, ast.While)

# What a cut member of a block is parsed inside, so that it is indented as in the file.
_BLOCK_HEAD = "if 1:\n"


def _member_cuts(stmt: ast.stmt, lines: list[str]) -> list[int]:
    """The lines (0-based) where the block of ``stmt`` (a top-level compound
    statement with one suite) is cut: before each statement of the block that
    begins its own line at the block's indent and follows only empty lines
    or comments at that indent (those go with it). Empty when the block is
    not cut."""
    if not isinstance(stmt, _ONE_SUITE) or getattr(stmt, "orelse", None) or len(stmt.body) < 2:
        return []
    body = stmt.body
    first = body[0]
    indent = lines[first.lineno - 1][:first.col_offset]
    if not indent or indent.strip():
        return []  # a one-line suite
    cuts = []
    end = first.end_lineno or first.lineno
    for member in body[1:]:
        at = _first_line(member) - 1
        gap = lines[end:at]
        line = lines[at]
        if at >= end and member.col_offset == len(indent) and line.startswith(indent) \
                and not line[len(indent):][:1].isspace() \
                and all(not g or (g.startswith(indent) and g[len(indent):][:1] == "#") for g in gap):
            cuts.append(end)
        end = max(end, member.end_lineno or member.lineno)
    return cuts


def split_top_level(source: str, tree: Optional[ast.Module]) -> Optional[list[Piece]]:
    """``source`` cut before top-level statements, the pieces' texts joining
    back to ``source``; ``None`` when the text is not cut (no ``ast``, a
    carriage return, fewer than two pieces).

    A cut is made at the first line of a statement (its first decorator's)
    that begins its own line, when the lines since the statement before
    hold no line that begins with whitespace (:func:`_indented_gap`). A
    piece "may hold an indent" when one of its statements opens an indented
    block or one of its gaps, or the file's end, has such a line: the
    pieces without are known to hold no ``INDENT`` token. A piece that is
    one compound statement with one suite (a class, a function, ``with``,
    ``if`` without ``else``, ...) is cut again before the statements of its
    block (:func:`_member_cuts`), so that an edit inside a large class or
    ``main()`` re-parses one method or statement, not the whole block.

    Args:
        source: the file's text.
        tree: Python's ``ast`` of ``source``.
    """
    if tree is None or "\r" in source or not tree.body:
        return None
    lines = source.split("\n")
    cuts: list[int] = []  # first line (0-based) of each piece after the first
    marks = [False]
    members: list[list[ast.stmt]] = [[]]
    last_end = 0  # lines (1-based, inclusive) the statements so far reach
    for stmt in tree.body:
        first = _first_line(stmt) - 1
        if stmt is not tree.body[0]:
            gap = _indented_gap(lines[last_end:first])
            # a statement that shares a line with the one before (``a; b``) or
            # does not begin its line stays in the piece before
            if not gap and first >= last_end and stmt.col_offset == 0 and not lines[first][:1].isspace():
                cuts.append(first)
                marks.append(False)
                members.append([])
            marks[-1] = marks[-1] or gap
        members[-1].append(stmt)
        marks[-1] = marks[-1] or _opens_indented_block(stmt, lines)
        last_end = max(last_end, stmt.end_lineno or stmt.lineno)
    tail = _indented_gap(lines[last_end:])
    marks[-1] = marks[-1] or tail
    starts = [0]  # offset of each line's first character
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    offsets = [0, *(starts[c] for c in cuts), len(source)]
    pieces = []
    for i in range(len(offsets) - 1):
        parts = None
        if len(members[i]) == 1 and not (tail and i == len(offsets) - 2):
            inner = _member_cuts(members[i][0], lines)
            if inner:
                bounds = [offsets[i], *(starts[c] for c in inner), offsets[i + 1]]
                parts = tuple(source[bounds[k]:bounds[k + 1]] for k in range(len(bounds) - 1))
        pieces.append(Piece(source[offsets[i]:offsets[i + 1]], marks[i], parts))
    if len(pieces) < 2 and pieces[0].parts is None:
        return None
    return pieces


class IncrementalParser:
    """Parses successive versions of one document, re-parsing only the
    top-level statements (and the statements of a top-level block) whose
    text changed since the previous version.

    Keeps the trees of the previous version's pieces only (memory: about one
    file's tree). Not thread-safe: one parser per document and thread.
    """

    def __init__(self) -> None:
        # text parsed -> (its module, the texts whose trees it is built from), of the last version
        self._trees: dict[str, tuple[cst.Module, frozenset[str]]] = {}
        # of the version being parsed: its texts' entries, and the texts whose previous tree it has placed
        self._current: dict[str, tuple[cst.Module, frozenset[str]]] = {}
        self._placed: set[str] = set()
        self.reused = 0  # trees taken from the previous version, in the last parse
        self.parsed = 0  # texts parsed, in the last parse (1 for a whole-file parse)

    def parse(self, source: str, tree: Optional[ast.Module]) -> cst.Module:
        """The module :func:`libcst.parse_module` gives for ``source``.

        Args:
            source: the document's text.
            tree: Python's ``ast`` of ``source`` (``None`` when Python's
                parser rejects it: the whole text is parsed).

        Raises:
            libcst.ParserSyntaxError: the text does not parse.
        """
        pieces = split_top_level(source, tree)
        self.reused = self.parsed = 0
        if pieces is not None:
            self._current, self._placed = {}, set()
            joined = self._join(pieces)
            if joined is not None:
                self._trees = self._current
                return joined
        self._trees, self._current, self._placed = {}, {}, set()
        self.reused, self.parsed = 0, 1
        return parse_module(source)

    def _reusable(self, text: str) -> Optional[cst.Module]:
        """The previous version's module of ``text`` when none of the trees
        it is built from is placed in this version yet, marking them placed.
        A tree goes into one place of a version only: the analysis tells
        nodes apart by identity, so two equal statements get trees of their
        own."""
        known = self._trees.get(text)
        if known is None or text in self._current or known[1] & self._placed:
            return None
        self._placed |= known[1]
        self.reused += 1
        self._current[text] = known
        return known[0]

    def _tree(self, text: str) -> Optional[cst.Module]:
        """The module of ``text``: the previous version's, or parsed
        (``None`` when LibCST rejects the text)."""
        module = self._reusable(text)
        if module is None:
            try:
                module = parse_module(text)
            except cst.ParserSyntaxError:
                return None
            self.parsed += 1
            self._current[text] = (module, frozenset((text,)))
        return module

    def _piece(self, piece: Piece) -> Optional[cst.Module]:
        """The module of one piece: the previous version's, joined from its
        block's parts, or parsed whole."""
        if piece.parts is None:
            return self._tree(piece.text)
        module = self._reusable(piece.text)
        if module is not None:
            return module
        module = self._join_block(piece.parts)
        if module is None:
            return self._tree(piece.text)
        if piece.text not in self._current:
            texts = frozenset((piece.parts[0], *(_BLOCK_HEAD + part for part in piece.parts[1:])))
            self._current[piece.text] = (module, texts | {piece.text})
        return module

    def _join_block(self, parts: tuple[str, ...]) -> Optional[cst.Module]:
        """The module of a one-statement piece from its parts: the head
        (the statement with its block's first statement) and each later
        statement of the block, parsed inside :data:`_BLOCK_HEAD`."""
        head = self._tree(parts[0])
        if head is None or len(head.body) != 1 or head.footer:
            return None
        stmt = head.body[0]
        block = getattr(stmt, "body", None)
        if not isinstance(block, cst.IndentedBlock) or block.footer or getattr(stmt, "orelse", None):
            return None
        body = list(block.body)
        last = None
        for text in parts[1:]:
            member = self._tree(_BLOCK_HEAD + text)
            if member is None or len(member.body) != 1 or member.header \
                    or member.default_indent != head.default_indent:
                return None
            wrapper = member.body[0]
            if not isinstance(wrapper, cst.If) or not isinstance(wrapper.body, cst.IndentedBlock) \
                    or wrapper.orelse is not None or wrapper.body.indent != block.indent:
                return None
            body.extend(wrapper.body.body)
            last = member
        assert last is not None
        joined = stmt.with_changes(body=block.with_changes(body=body, footer=last.body[0].body.footer))
        return head.with_changes(body=[joined], footer=last.footer, has_trailing_newline=last.has_trailing_newline)

    def _join(self, pieces: list[Piece]) -> Optional[cst.Module]:
        """The pieces' modules joined, or ``None`` where a piece cannot stand
        for its part of the whole-file parse."""
        modules = []
        indent: Optional[str] = None  # the file's first indented block's indent
        for piece in pieces:
            module = self._piece(piece)
            if module is None:
                return None
            if piece.indented:  # may hold an INDENT: the first one sets the file's indent
                if indent is None:
                    indent = module.default_indent
                elif module.default_indent != indent:
                    return None
            modules.append(module)
        if len(modules) == 1:
            return modules[0]
        body: list[cst.BaseStatement] = list(modules[0].body)
        for before, module in zip(modules, modules[1:]):
            stmts = list(module.body)
            if module.header or not stmts or stmts[0].leading_lines:
                return None  # a piece that does not begin with its statement
            stmts[0] = stmts[0].with_changes(leading_lines=before.footer)
            body.extend(stmts)
        last = modules[-1]
        return modules[0].with_changes(body=body, footer=last.footer,
                                       default_indent=indent if indent is not None else modules[0].default_indent,
                                       has_trailing_newline=last.has_trailing_newline)
