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
        message: what is wrong and what to do, one sentence or two.
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

    @property
    def sort_key(self) -> tuple[str, int, int, str]:
        """Key that orders output by path, line, column, then code."""
        return (self.path, self.line, self.col, self.code)


PARSE_ERROR_CODE = "TGL000"


@dataclass
class LintResult:
    """Diagnostics of one file plus whether the parser ran on it."""

    diagnostics: list[Diagnostic]
    parsed: bool


def read_file(path: str, display: Optional[str] = None) -> Union[bytes, LintResult]:
    """The bytes of ``path``, or a one-``TGL000`` result when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        return LintResult([Diagnostic(PARSE_ERROR_CODE, f"file could not be read: {exc.strerror or exc}",
                                      display or path, 1, 1, 1, 1)], False)
