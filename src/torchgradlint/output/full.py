"""Each diagnostic with its rule name, source context and a caret under its
span, then its detail (why, and the fix), in ruff's ``full`` layout::

    train.py:8:5: TGL001 `opt` steps in a loop with `backward()` but ...
      |
    6 |     loss = model(x).sum()
    7 |     loss.backward()
    8 |     opt.step()
      |     ^^^^^^^^^^ missing-zero-grad
    9 | print("done")
      |
      = So each step applies the sum of all earlier gradients; ...
      = fix (safe): replace with `losses.append(loss.item())`

For a notebook the excerpt is the lines of the cell the diagnostic names.
Lines are counted as Python counts them (:mod:`torchgradlint.lines`).
"""

from __future__ import annotations

from typing import Optional, Sequence

from ..diagnostics import Diagnostic
from ..lines import split_lines
from ._common import rule_name
from .concise import format_line

CONTEXT = 2
"""Source lines shown before and after the reported line."""


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


def excerpt(d: Diagnostic, lines: Sequence[str]) -> list[str]:
    """The context lines of ``d`` with a caret line under its span, labelled
    with the rule name (empty when ``d.line`` is not in ``lines``)."""
    if not 1 <= d.line <= len(lines):
        return []
    first, last = max(1, d.line - CONTEXT), min(len(lines), d.line + CONTEXT)
    width = len(str(last))
    src = lines[d.line - 1]
    span = (d.end_col - d.col) if d.end_line == d.line else len(src) - d.col + 1
    out = [f"{'':>{width}} |"]
    for n in range(first, last + 1):
        out.append(f"{n:>{width}} | {lines[n - 1]}".rstrip())
        if n == d.line:
            label = rule_name(d.code)
            out.append(f"{'':>{width}} | {' ' * (d.col - 1)}{'^' * max(1, span)} {label}".rstrip())
    out.append(f"{'':>{width}} |")
    return out


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """Diagnostics with source context, caret, detail and fix, separated by blank lines."""
    chunks = []
    cache: dict = {}
    unsafe = getattr(ctx, "unsafe_fixes", False)
    for d in diagnostics:
        body = excerpt(d, _lines(d, ctx, cache))
        pad = " " * (body[0].index("|") if body else 2)
        text = [format_line(d, unsafe)]
        text += body or [f"{pad}= rule: {rule_name(d.code)}"]
        if d.detail:
            text.append(f"{pad}= {d.detail}")
        if d.fix is not None:
            kind = "safe" if d.fix.safe else "unsafe, needs --unsafe-fixes"
            text.append(f"{pad}= fix ({kind}): replace with `{d.fix.replacement}`")
        chunks.append("\n".join(text) + "\n")
    return "\n".join(chunks)
