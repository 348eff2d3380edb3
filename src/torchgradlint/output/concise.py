"""``path:line:col: CODE message``, one line per diagnostic (the default)."""

from __future__ import annotations

from typing import Sequence

from ..diagnostics import Diagnostic


def format_line(d: Diagnostic) -> str:
    """One diagnostic as ``path:line:col: CODE message`` (1-based line and column)."""
    return f"{d.path}:{d.line}:{d.col}: {d.code} {d.message}"


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """All diagnostics, one per line."""
    return "".join(format_line(d) + "\n" for d in diagnostics)
