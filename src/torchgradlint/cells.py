"""Cells written for another deep-learning framework.

Notebooks and percent-format scripts (``# %%`` cells: Jupytext, VS Code,
Spyder) often hold the same lesson for several frameworks side by side — d2l's
sources tag each cell ``#@tab mxnet`` / ``#@tab pytorch`` / ``#@tab all`` —
or switch framework from one cell to the next. A cell for MXNet, TensorFlow or
JAX follows that framework's semantics (MXNet's Gluon overwrites gradients on
every backward, so ``trainer.step()`` needs no reset), so no torch rule may
report in it.

A cell is *foreign* when its ``#@tab`` tag names only other frameworks, or,
untagged, when it imports another framework and not torch.
"""

from __future__ import annotations

import re
from typing import Sequence

#: top-level packages of the deep-learning frameworks that are not PyTorch
FOREIGN_FRAMEWORKS = frozenset({"mxnet", "tensorflow", "keras", "jax", "flax", "paddle", "mindspore", "oneflow",
                                "chainer"})
_TORCH_TAGS = frozenset({"pytorch", "torch", "all"})
_TAG = re.compile(r"^\s*#\s*@tab\s+(.+?)\s*$")
_IMPORT = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_][A-Za-z0-9_]*)")
_CELL_MARKER = re.compile(r"^\s*#\s*%%")


def foreign_cell(lines: Sequence[str]) -> bool:
    """Whether a cell's source lines are written for another framework."""
    for line in lines:
        tag = _TAG.match(line)
        if tag:
            names = {t.lower() for t in re.split(r"[\s,]+", tag.group(1)) if t}
            return not (names & _TORCH_TAGS)
    imported = {m.group(1) for line in lines if (m := _IMPORT.match(line))}
    return bool(imported & FOREIGN_FRAMEWORKS) and "torch" not in imported


def foreign_spans(source: str) -> list[tuple[int, int]]:
    """1-based inclusive line spans of the foreign cells of a percent-format
    script (``[]`` when the file has no ``# %%`` markers)."""
    if "%%" not in source:
        return []
    lines = source.splitlines()
    starts = [i for i, line in enumerate(lines) if _CELL_MARKER.match(line)]
    if not starts:
        return []
    bounds = ([0] if starts[0] else []) + starts + [len(lines)]
    return [(a + 1, b) for a, b in zip(bounds, bounds[1:]) if b > a and foreign_cell(lines[a:b])]


def in_spans(line: int, spans: Sequence[tuple[int, int]]) -> bool:
    """Whether 1-based ``line`` lies in one of ``spans``."""
    return any(a <= line <= b for a, b in spans)
