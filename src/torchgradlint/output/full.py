"""Each diagnostic with the offending source line and a caret under its span.

For a notebook the excerpt is the line of the cell the diagnostic names.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..diagnostics import Diagnostic
from ..lines import split_lines
from .concise import format_line


def _lines(d: Diagnostic, ctx, cache: dict) -> list[str]:
    source: Optional[str] = ctx.sources.get(d.path)
    if not source:
        return []
    if d.cell is None:
        key = d.path
        if key not in cache:
            cache[key] = split_lines(source)
        return cache[key]
    key = (d.path, d.cell)
    if key not in cache:
        from ..notebook import NotebookError, code_cells, load_notebook

        try:
            cells = code_cells(load_notebook(source))
            cache[key] = split_lines(cells[d.cell - 1]) if 0 < d.cell <= len(cells) else []
        except NotebookError:
            cache[key] = []
    return cache[key]


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """Diagnostics followed by a source excerpt and a caret line each."""
    chunks = []
    cache: dict = {}
    for d in diagnostics:
        text = format_line(d)
        lines = _lines(d, ctx, cache)
        if 1 <= d.line <= len(lines):
            src = lines[d.line - 1]
            width = (d.end_col - d.col) if d.end_line == d.line else len(src) - d.col + 1
            gutter = f"{d.line:>5} | "
            text += f"\n{gutter}{src}\n{' ' * (len(gutter) + d.col - 1)}{'^' * max(1, width)}"
        chunks.append(text + "\n")
    return "\n".join(chunks)
