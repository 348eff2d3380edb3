"""``path:line:col: CODE message``, one line per diagnostic (the default).

Notebook diagnostics read ``nb.ipynb:cell 3:4:5: CODE message`` (code cell 3,
line 4 of that cell, column 5).
"""

from __future__ import annotations

from typing import Sequence

from ..diagnostics import Diagnostic


def location(d: Diagnostic) -> str:
    """``path:line:col`` or, in a notebook, ``path:cell N:line:col`` (1-based)."""
    if d.cell is not None:
        return f"{d.path}:cell {d.cell}:{d.line}:{d.col}"
    return f"{d.path}:{d.line}:{d.col}"


def format_line(d: Diagnostic) -> str:
    """One diagnostic as ``path:line:col: CODE message`` (1-based line and column)."""
    return f"{location(d)}: {d.code} {d.message}"


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """All diagnostics, one per line."""
    return "".join(format_line(d) + "\n" for d in diagnostics)
