"""Helpers shared by the CI formats (github, sarif, junit)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from ..diagnostics import PARSE_ERROR_CODE, PARSE_ERROR_NAME, Diagnostic


def rule_name(code: str) -> str:
    """The kebab name of a rule code (``parse-error`` for ``TGL000``; ``""``
    for an unknown code), from the rule index: imports no rule."""
    if code == PARSE_ERROR_CODE:
        return PARSE_ERROR_NAME
    from ..registry import rule_name as indexed_name

    try:
        return indexed_name(code)
    except KeyError:
        return ""


def fix_message(d: Diagnostic) -> str:
    """One line saying what ``d``'s fix does (it must have one)."""
    assert d.fix is not None
    return f"Replace with `{d.fix.replacement}`" if "\n" not in d.fix.replacement else "Replace the flagged code"


def file_region(d: Diagnostic, ctx, cache: dict) -> Optional[tuple[int, int, int, int]]:
    """1-based ``(line, col, end_line, end_col)`` of ``d`` in the file itself.

    The diagnostic's own span for a Python file; for a notebook, the span of
    the cell line inside the notebook's JSON text, or ``None`` when that line
    cannot be located (then only the file is named).
    """
    if d.cell is None:
        return d.line, d.col, d.end_line, d.end_col
    from ..notebook import json_positions, json_region

    if d.path not in cache:
        raw = ctx.sources.get(d.path)
        cache[d.path] = json_positions(raw) if raw else {}
    return json_region(cache[d.path], d)


def repo_root(start: Optional[str] = None) -> Path:
    """The git work tree holding ``start`` (default: the current folder), else ``start``."""
    from ..files import git_work_tree

    here = Path(os.path.abspath(start or os.getcwd()))
    return git_work_tree(here) or here
