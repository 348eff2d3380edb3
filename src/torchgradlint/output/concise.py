"""``path:line:col: CODE [*] message``, one line per diagnostic (the default).

``[*]`` marks a finding that ``--fix`` fixes (a safe fix; an unsafe one too
when ``--unsafe-fixes`` is given), as ruff marks them.

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


def applies(d: Diagnostic, unsafe: bool = False) -> bool:
    """Whether ``--fix`` (with ``--unsafe-fixes`` when ``unsafe``) fixes ``d``."""
    return d.fix is not None and (d.fix.safe or unsafe)


def format_line(d: Diagnostic, unsafe: bool = False) -> str:
    """One diagnostic as ``path:line:col: CODE [*] message`` (1-based line
    and column; ``[*]`` only when :func:`applies`)."""
    mark = "[*] " if applies(d, unsafe) else ""
    return f"{location(d)}: {d.code} {mark}{d.message}"


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """All diagnostics, one per line."""
    unsafe = getattr(ctx, "unsafe_fixes", False)
    return "".join(format_line(d, unsafe) + "\n" for d in diagnostics)
