"""Output formats. Each module renders a sorted list of diagnostics to text.

``FORMATS`` maps a ``--output-format`` name to ``render(diagnostics, ctx)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ..diagnostics import Diagnostic


@dataclass
class RenderContext:
    """What renderers may need beyond the diagnostics.

    ``sources`` maps a diagnostic's path to its text (for excerpts), when read.
    """

    sources: dict[str, str] = field(default_factory=dict)
    files_checked: int = 0


Renderer = Callable[[Sequence[Diagnostic], RenderContext], str]


def _registry() -> dict[str, Renderer]:
    from . import concise, full, json_format

    return {
        "concise": concise.render,
        "full": full.render,
        "json": json_format.render,
    }


FORMATS = _registry()
