"""The diagnostic record every front-end (CLI, flake8, output formats) shares."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union


@dataclass(frozen=True)
class Fix:
    """A replacement of one source span, produced by a rule's autofix.

    Attributes:
        start: ``(line, col)`` of the first replaced character; 1-based line,
            1-based column.
        end: ``(line, col)`` just past the last replaced character, same units.
        replacement: text that replaces the span.
        safe: ``True`` when applying the fix cannot change program behaviour
            beyond removing the defect (``--fix``); ``False`` needs
            ``--unsafe-fixes``.
    """

    start: tuple[int, int]
    end: tuple[int, int]
    replacement: str
    safe: bool = True


@dataclass(frozen=True)
class Diagnostic:
    """One finding of one rule at one place in one file.

    Attributes:
        code: rule code, e.g. ``"TGL001"``; ``"TGL000"`` marks a file that
            could not be read or parsed.
        message: what is wrong and where, in the user's names: one line,
            at most about 100 characters (the concise output's text).
        path: the file as the user named it (relative paths stay relative).
        line: 1-based line of the reported node's start.
        col: 1-based column of the reported node's start (flake8 receives
            ``col - 1``).
        end_line: 1-based line of the reported node's end.
        end_col: 1-based column just past the node's end.
        fix: optional autofix.
        cell: for a Jupyter notebook, the 1-based index of the code cell
            (among the notebook's code cells); ``line``/``end_line`` are then
            1-based lines within that cell. ``None`` for ordinary files.
        detail: optional longer text: why it is a defect and how to fix it
            (shown by the ``full``, ``json`` and ``sarif`` formats).
    """

    code: str
    message: str
    path: str
    line: int
    col: int
    end_line: int
    end_col: int
    fix: Optional[Fix] = field(default=None, compare=False)
    cell: Optional[int] = None
    detail: Optional[str] = field(default=None, compare=False)

    @property
    def sort_key(self) -> tuple[str, int, int, str]:
        """Key that orders output by path, line, column, then code."""
        return (self.path, self.line, self.col, self.code)


PARSE_ERROR_CODE = "TGL000"
PARSE_ERROR_NAME = "parse-error"
PARSE_ERROR_DOCS = """\
## What it does
Reports a file that torchgradlint did not lint: it could not be read, decoded
(its bytes are not valid in its declared encoding), parsed (a syntax error, or
nesting too deep for the parser), or a notebook is not valid notebook JSON. It
also reports an internal error (a bug in torchgradlint while linting that file;
the traceback is printed on standard error and the run exits 2: please report
it).

## Why is this bad?
No rule ran on the file, so it may hold defects that nobody saw. The other
files are still linted.

## Example
```python
for x in data:
    loss = model(x
```

## Use instead
Fix the syntax error (the message gives Python's own description and place),
or the file's encoding, and run again. `TGL000` is not a selectable rule:
to skip such a file, exclude it (`exclude` / `--exclude`).
"""

_CLAUSE_ENDS = (", ", ": ", "; ", " although ", " (")


def split_message(text: str) -> tuple[str, str]:
    """``(message, detail)``: a finding's long text cut after its first clause.

    The cut falls at the first ``", "``, ``": "``, ``"; "``, ``" although "``
    or ``" ("`` outside backticks and parentheses (a parenthesis that starts
    the detail loses its brackets); the detail starts with a capital letter
    and ends with a full stop. A text without such a place is
    all message, with an empty detail.
    """
    depth, code = 0, False
    for i, ch in enumerate(text):
        if ch == "`":
            code = not code
        elif not code and ch == "(":
            if depth == 0 and text.startswith(" (", i - 1):
                close = _closing(text, i)
                return _cut(text[:close] + text[close + 1:] if close > 0 else text, i - 1, 2)
            depth += 1
        elif not code and ch == ")":
            depth = max(0, depth - 1)
        elif not code and depth == 0:
            for end in _CLAUSE_ENDS[:-1]:
                if text.startswith(end, i):
                    return _cut(text, i, len(end))
    return text, ""


def _closing(text: str, at: int) -> int:
    """Index of the ``)`` that closes the ``(`` at ``at`` (outside backticks), or -1."""
    depth, code = 0, False
    for j in range(at, len(text)):
        if text[j] == "`":
            code = not code
        elif not code and text[j] in "()":
            depth += 1 if text[j] == "(" else -1
            if depth == 0:
                return j
    return -1


def _cut(text: str, at: int, skip: int) -> tuple[str, str]:
    rest = text[at + skip:].strip()
    if rest and not rest.endswith((".", "!", "?")):
        rest += "."
    return text[:at], rest[:1].upper() + rest[1:]


@dataclass
class LintResult:
    """Diagnostics of one file plus whether the parser ran on it, and
    ``deps``: ``[path, sha256]`` of the other project files whose facts the
    result rests on (see :mod:`torchgradlint.project_index`)."""

    diagnostics: list[Diagnostic]
    parsed: bool
    deps: list = field(default_factory=list)


def read_file(path: str, display: Optional[str] = None) -> Union[bytes, LintResult]:
    """The bytes of ``path``, or a one-``TGL000`` result when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        return LintResult([Diagnostic(PARSE_ERROR_CODE, f"file could not be read: {exc.strerror or exc}",
                                      display or path, 1, 1, 1, 1)], False)
