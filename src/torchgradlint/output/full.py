"""Each diagnostic with the offending source line and a caret under its span."""

from __future__ import annotations

from typing import Sequence

from ..diagnostics import Diagnostic
from .concise import format_line


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """Diagnostics followed by a source excerpt and a caret line each."""
    chunks = []
    for d in diagnostics:
        text = format_line(d)
        source = ctx.sources.get(d.path)
        lines = source.splitlines() if source else []
        if 1 <= d.line <= len(lines):
            src = lines[d.line - 1]
            width = (d.end_col - d.col) if d.end_line == d.line else len(src) - d.col + 1
            gutter = f"{d.line:>5} | "
            text += f"\n{gutter}{src}\n{' ' * (len(gutter) + d.col - 1)}{'^' * max(1, width)}"
        chunks.append(text + "\n")
    return "\n".join(chunks)
