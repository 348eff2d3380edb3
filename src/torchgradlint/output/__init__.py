"""Output formats. Each module renders a sorted list of diagnostics to text.

:func:`renderer` gives the ``render(diagnostics, ctx)`` of a ``--output-format`` name:
``concise`` (default), ``full`` (source excerpt and caret), ``json``,
``json-lines``, ``github`` (workflow-command annotations), ``sarif`` (SARIF
2.1.0 for code scanning) and ``junit`` (JUnit XML).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from ..diagnostics import Diagnostic


@dataclass
class RenderContext:
    """What renderers may need beyond the diagnostics.

    ``sources`` maps a diagnostic's path to its text (for excerpts; for a
    notebook, its JSON text), when read. ``paths`` lists every file checked
    (junit reports clean files as passing tests). ``root`` is the folder that
    SARIF URIs are relative to (default: the git work tree holding the
    current folder, else the current folder). ``unsafe_fixes``: the run has
    ``--unsafe-fixes``, so unsafe fixes count as fixable (``[*]``).
    """

    sources: dict[str, str] = field(default_factory=dict)
    paths: list[str] = field(default_factory=list)
    root: Optional[str] = None
    unsafe_fixes: bool = False


Renderer = Callable[[Sequence[Diagnostic], RenderContext], str]


_MODULES = {
    "concise": "concise",
    "full": "full",
    "json": "json_format",
    "json-lines": "json_lines",
    "github": "github",
    "sarif": "sarif",
    "junit": "junit",
}


FORMAT_NAMES = tuple(_MODULES)


def renderer(name: str) -> Renderer:
    """The ``render(diagnostics, ctx)`` function of an output format; its
    module is imported here, on use (a run renders one format).

    Raises:
        KeyError: no such format.
    """
    import importlib

    return importlib.import_module(f"{__name__}.{_MODULES[name]}").render


# Formats that need the text of files with findings in RenderContext.sources.
NEEDS_SOURCES = frozenset({"full", "sarif", "github"})
