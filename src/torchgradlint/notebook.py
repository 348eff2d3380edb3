"""Jupyter notebooks (``.ipynb``): lint the code cells as one program.

The code cells are joined in order into one source text, one line per cell
line, so the analysis sees names defined in earlier cells. IPython syntax that
is not Python is replaced by lines that keep the line count: a cell magic cell
(``%%time``, ``%%bash``) becomes blank lines, a line magic (``%matplotlib``),
a shell escape (``!pip install``), an assignment from one (``x = !ls``), a
magic written without ``%`` that is no Python statement (``pip install x``,
``cd ..``: IPython's automagic) and a help line (``obj?``, ``??obj``, a
wildcard search ``torch.*Tensor?``) become ``pass`` at the same indentation;
as IPython does first, a cell whose first line is indented loses that
indentation on every line that starts with it (columns are mapped back).
``# noqa`` comments work inside cells as in files.

Findings are mapped back to ``(cell, line in cell)``: ``Diagnostic.cell`` is
the 1-based index of the code cell among the notebook's code cells (markdown
and raw cells are not counted) and ``line`` is 1-based within that cell. A
notebook that is not valid JSON, or not shaped like a notebook, gives one
``TGL000`` diagnostic.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Union

from .cells import foreign_cell
from .diagnostics import PARSE_ERROR_CODE, Diagnostic, LintResult
from .lines import split_lines

NOTEBOOK_SUFFIX = ".ipynb"

_MAGIC_LINE = re.compile(r"^(\s*)(?:[%!]|[\w.]+\s*=\s*[%!])")
# IPython help: ``obj?``, ``obj??``, ``?obj``, ``??obj``, and the wildcard search ``torch.*Tensor?``
_HELP_LINE = re.compile(r"^(\s*)(?:\?{1,2}[\w.*]+|[\w.*]+\?{1,2})\s*$")
# Line magics and shell aliases IPython runs without ``%`` (automagic, on by default: ``pip install
# diffusers``, ``cd ..``, ``matplotlib inline``), when the line is no Python statement.
_AUTOMAGIC = re.compile(r"^(\s*)(?:pip3?|conda|mamba|micromamba|cd|pwd|env|set_env|load_ext|reload_ext|matplotlib|"
                        r"time|timeit|run|cat|mkdir|rmdir|rm|cp|mv|ls|less|man)[ \t]+[\w\-./~'\"$]")


class NotebookError(ValueError):
    """The file is not a readable notebook (bad JSON or wrong shape)."""


def is_notebook(path: str) -> bool:
    """Whether ``path`` names a Jupyter notebook (by suffix)."""
    return path.lower().endswith(NOTEBOOK_SUFFIX)


def _cell_text(cell: dict[str, Any]) -> str:
    src = cell.get("source", "")
    if isinstance(src, list):
        if not all(isinstance(s, str) for s in src):
            raise NotebookError("a cell's 'source' holds a non-string")
        return "".join(src)
    if not isinstance(src, str):
        raise NotebookError("a cell's 'source' is neither a string nor a list of strings")
    return src


def load_notebook(text: str) -> dict[str, Any]:
    """Parse notebook JSON and check its shape (a ``cells`` list of objects).

    Raises:
        NotebookError: invalid JSON or no ``cells`` list.
    """
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as exc:
        raise NotebookError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise NotebookError("no 'cells' list at the top level")
    if not all(isinstance(c, dict) for c in nb["cells"]):
        raise NotebookError("a cell is not a JSON object")
    return nb


def code_cells(nb: dict[str, Any]) -> list[str]:
    """The source text of each code cell, in order (code cell 1 is index 0).

    Raises:
        NotebookError: a cell's ``source`` is malformed.
    """
    return [_cell_text(c) for c in nb["cells"] if c.get("cell_type") == "code"]


def _python_lines(cell: str) -> list[str]:
    """The cell's lines with IPython syntax replaced (see the module docstring).
    Only a line that starts a statement can be IPython syntax: a line inside
    brackets, a triple-quoted string or after a backslash continues the one
    before (``print('...'\n      % (epoch, loss))`` is Python's ``%``). A
    shell escape or magic ending in a backslash continues on the next line
    (``!python detect.py \\`` then ``  --conf 0.25``), which becomes blank."""
    lines = split_lines(cell)
    if lines and lines[0].lstrip().startswith("%%"):
        return [""] * len(lines)
    out = []
    state = _Continuation()
    magic = False  # the previous line was IPython syntax ending in a backslash: this one continues it
    for line in lines:
        m = None if magic or state.continues() else (_MAGIC_LINE.match(line) or _HELP_LINE.match(line)
                                                     or _automagic(line))
        if magic or m:
            out.append(f"{m.group(1)}pass" if m else "")
            magic = line.rstrip("\r\n").endswith("\\")
        else:
            state.scan(line)
            out.append(line)
    return out


def without_ipython_syntax(source: str) -> Optional[str]:
    """``source`` (a ``.py`` file, often a notebook exported as a script:
    ``%matplotlib inline``, ``!pip install ...``) with its IPython syntax
    replaced line for line as in a code cell (:func:`_python_lines`), every
    other line and every line break kept as it is, so line numbers, columns
    and fixes stay those of ``source``; ``None`` when it holds none."""
    original = split_lines(source, keepends=True)
    converted = _python_lines(source)
    if len(converted) != len(original):
        return None
    out: list[str] = []
    changed = False
    for orig, new in zip(original, converted):
        body = orig.rstrip("\r\n")
        if new != body:
            changed = True
            out.append(new + orig[len(body):])
        else:
            out.append(orig)
    return "".join(out) if changed else None


def _automagic(line: str) -> "Optional[re.Match[str]]":
    """The match of a line IPython runs as a magic without ``%`` (``pip install x``), or ``None``
    (the line also compiles as Python: ``time.sleep(1)`` or ``rm - rf`` stays Python)."""
    m = _AUTOMAGIC.match(line)
    if m is None:
        return None
    try:
        compile(line.strip(), "<cell>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except (SyntaxError, ValueError):
        return m
    return None


class _Continuation:
    """Whether the next line continues a statement: open brackets, an open
    triple-quoted string, or a trailing backslash, tracked line by line
    (strings and comments skipped; a tokenizer is no use on cells that hold
    IPython syntax)."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote: Optional[str] = None  # the delimiter of an open triple-quoted string
        self.backslash = False

    def continues(self) -> bool:
        return bool(self.depth or self.quote or self.backslash)

    def scan(self, line: str) -> None:
        text = line.rstrip("\r\n")
        i, n = 0, len(text)
        while i < n:
            if self.quote:
                end = text.find(self.quote, i)
                if end < 0:
                    break
                i, self.quote = end + 3, None
                continue
            c = text[i]
            if c == "#":
                n = i
                break
            if c in "\"'":
                if text.startswith(c * 3, i):
                    self.quote, i = c * 3, i + 3
                    continue
                i += 1
                while i < n and text[i] != c:
                    i += 2 if text[i] == "\\" else 1
            elif c in "([{":
                self.depth += 1
            elif c in ")]}":
                self.depth = max(0, self.depth - 1)
            i += 1
        self.backslash = not self.quote and text[:n].endswith("\\")


@dataclass
class JoinedSource:
    """The code cells joined into one program, and where each line came from.

    ``origin[i]`` is ``(cell, line)`` (both 1-based) of joined line ``i + 1``.
    """

    source: str
    origin: list[tuple[int, int]]
    # joined line index (0-based) -> columns IPython's leading-indent cleanup removed from it
    shifts: dict[int, int] = dataclasses.field(default_factory=dict)

    def cell_starts(self) -> dict[int, int]:
        """``cell -> first joined line`` (1-based) of every cell with lines."""
        starts: dict[int, int] = {}
        for i, (cell, _) in enumerate(self.origin, start=1):
            starts.setdefault(cell, i)
        return starts

    def cell_source(self, cell: int) -> str:
        """The (magic-neutralised) source of one cell, as joined."""
        lines = self.source.split("\n")
        return "".join(lines[i] + "\n" for i, (c, _) in enumerate(self.origin) if c == cell)

    def blank_cells(self, cells: "set[int]") -> "JoinedSource":
        """The same program with ``cells`` replaced by blank lines (same line numbers)."""
        lines = self.source.split("\n")
        kept = ["" if self.origin[i][0] in cells else line for i, line in enumerate(lines[:len(self.origin)])]
        return JoinedSource("".join(line + "\n" for line in kept), self.origin, self.shifts)

    def locate(self, line: int) -> tuple[int, int]:
        """``(cell, line in cell)`` of a 1-based joined line (clamped)."""
        if not self.origin:
            return 1, 1
        return self.origin[max(0, min(line, len(self.origin)) - 1)]


def join_cells(cells: Sequence[str]) -> JoinedSource:
    """Join code cells into one program with magics neutralised and the cells
    of another framework (:mod:`torchgradlint.cells`) blanked."""
    lines: list[str] = []
    origin: list[tuple[int, int]] = []
    shifts: dict[int, int] = {}
    for n, cell in enumerate(cells, start=1):
        cell, removed = _leading_indent(cell)
        cell_lines = _python_lines(cell)
        if foreign_cell(cell_lines):  # another framework's cell: kept as blank lines
            cell_lines = [""] * len(cell_lines)
        for i, line in enumerate(cell_lines, start=1):
            if removed[i - 1]:
                shifts[len(lines)] = removed[i - 1]
            lines.append(line)
            origin.append((n, i))
    return JoinedSource("".join(line + "\n" for line in lines), origin, shifts)


_INDENT = re.compile(r"[ \t]+")


def _leading_indent(cell: str) -> tuple[str, list[int]]:
    """IPython's first input cleanup (``inputtransformer2.leading_indent``):
    when a cell's first line is indented, that indentation is removed from
    every line that starts with it (`` def f(a):`` / ``    return a`` runs
    in Jupyter). Returns the cell and, per line, the columns removed."""
    lines = split_lines(cell, True)
    m = _INDENT.match(lines[0]) if lines else None
    if m is None:
        return cell, [0] * len(lines)
    space = m.group(0)
    removed = [len(space) if line.startswith(space) else 0 for line in lines]
    return "".join(line[k:] for line, k in zip(lines, removed)), removed


def _language_is_python(nb: dict[str, Any]) -> bool:
    meta = nb.get("metadata")
    if not isinstance(meta, dict):
        return True
    info = meta.get("language_info")
    name = info.get("name") if isinstance(info, dict) else None
    if name is None:
        ks = meta.get("kernelspec")
        name = ks.get("language") if isinstance(ks, dict) else None
    return name is None or str(name).lower() in ("python", "python3", "ipython")


def _error(path: str, reason: str) -> Diagnostic:
    return Diagnostic(PARSE_ERROR_CODE, f"notebook could not be read, so it was not linted: {reason}",
                      path, 1, 1, 1, 1)


def read_notebook(data: bytes, path: str) -> Union[JoinedSource, LintResult]:
    """A notebook file's code cells joined into one program, ready for the
    engine; or the final result when there is nothing to lint: one ``TGL000``
    for bytes that are not a UTF-8 notebook, no diagnostics for a notebook of
    another language. (The engine composes this module with the linter, so
    this module does not import the engine.)"""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return LintResult([_error(path, f"not UTF-8: {exc.reason}")], False)
    try:
        nb = load_notebook(text)
        cells = code_cells(nb)
    except NotebookError as exc:
        return LintResult([_error(path, str(exc))], False)
    if not _language_is_python(nb):
        return LintResult([], False)
    return join_cells(cells)


def map_to_cells(result: LintResult, joined: JoinedSource) -> LintResult:
    """``result`` of the joined program with every diagnostic moved to
    ``(cell, line in cell)``."""
    mapped = []
    for d in result.diagnostics:
        cell, line = joined.locate(d.line)
        end_cell, end_line = joined.locate(d.end_line)
        col = d.col + joined.shifts.get(d.line - 1, 0)
        end_col = d.end_col + joined.shifts.get(d.end_line - 1, 0)
        if end_cell != cell:  # a span cannot leave its cell: clamp to one character
            end_line, end_col = line, col + 1
        # Fixes hold joined-source positions: not applicable to the JSON file, so dropped.
        mapped.append(dataclasses.replace(d, line=line, col=col, end_line=end_line, end_col=end_col, cell=cell,
                                          fix=None))
    return LintResult(mapped, result.parsed)


def json_positions(raw: str) -> dict[tuple[int, int], tuple[int, int, str]]:
    """Where each code cell line sits in the notebook's JSON text.

    Maps ``(cell, line in cell)`` (1-based, code cells counted as in
    :class:`~torchgradlint.diagnostics.Diagnostic`) to ``(json line, offset of
    the string's opening quote in that line, the string's JSON text)``. Lines
    that cannot be found (a ``source`` given as one string) are left out.
    Used to point SARIF and GitHub annotations at the real line of the file.
    """
    try:
        nb = load_notebook(raw)
    except NotebookError:
        return {}
    out: dict[tuple[int, int], tuple[int, int, str]] = {}
    cursor = 0
    code_index = 0
    for cell in nb["cells"]:
        is_code = cell.get("cell_type") == "code"
        code_index += is_code
        src = cell.get("source")
        key = raw.find('"source"', cursor)
        if key < 0:
            break
        cursor = key + len('"source"')
        if not isinstance(src, list):
            continue
        line_no = 0
        for piece in src:
            if not isinstance(piece, str):
                break
            for candidate in (json.dumps(piece, ensure_ascii=False), json.dumps(piece)):
                at = raw.find(candidate, cursor)
                if at >= 0:
                    break
            else:
                break
            cursor = at + len(candidate)
            line_no += 1
            if is_code:
                json_line = raw.count("\n", 0, at) + 1
                out[(code_index, line_no)] = (json_line, at - (raw.rfind("\n", 0, at) + 1), candidate)
    return out


def json_region(positions: dict[tuple[int, int], tuple[int, int, str]],
                d: Diagnostic) -> Optional[tuple[int, int, int, int]]:
    """1-based ``(line, col, end_line, end_col)`` of a notebook diagnostic in
    the JSON text, or ``None`` when the cell line was not located."""
    if d.cell is None:
        return None
    start = positions.get((d.cell, d.line))
    end = positions.get((d.cell, d.end_line))
    if start is None or end is None:
        return None

    def col(pos: tuple[int, int, str], c: int) -> int:
        json_line, offset, encoded = pos
        text = json.loads(encoded)
        prefix = json.dumps(text[: c - 1], ensure_ascii=encoded.isascii())
        return offset + len(prefix) - 1 + 1  # after the quote, minus the prefix's closing quote; 1-based

    return start[0], col(start, d.col), end[0], col(end, d.end_col)


#: top-level ``await`` is valid in a notebook cell (IPython runs it)
_COMPILE_FLAGS = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT


def unparsable_cells(joined: JoinedSource) -> dict[int, tuple[int, int, str]]:
    """Cells that do not compile on their own: ``cell -> (line in cell,
    column, message)`` from Python's compiler (a ``# TODO`` exercise cell, a
    half-written statement). The other cells can still be linted."""
    bad: dict[int, tuple[int, int, str]] = {}
    for cell in joined.cell_starts():
        try:
            compile(joined.cell_source(cell), f"<cell {cell}>", "exec", flags=_COMPILE_FLAGS, dont_inherit=True)
        except SyntaxError as err:
            bad[cell] = (err.lineno or 1, err.offset or 1, err.msg)
        except (ValueError, RecursionError, MemoryError) as err:
            bad[cell] = (1, 1, str(err) or type(err).__name__)
    return bad
