"""flake8 plugin (entry point ``TGL`` under ``flake8.extension``).

A thin adapter: source lines → the engine → ``(line, 0-based col, "TGL001
message", type)``. flake8 applies ``# noqa`` itself in this mode. When
flake8's own select/ignore decision excludes every TGL rule, the plugin
returns at once without parsing.
"""

from __future__ import annotations

import argparse
from typing import Any, Iterator

from . import __version__
from .engine import lint_source
from .registry import Rule, all_rules


class Plugin:
    """flake8 AST-plugin shape; ``tree`` is accepted (flake8 requires it) and
    ignored: the engine parses with LibCST."""

    name = "torchgradlint"
    version = __version__
    _rules: list[type[Rule]] | None = None

    def __init__(self, tree: Any, lines: list[str], filename: str) -> None:
        self.lines = lines
        self.filename = filename

    @classmethod
    def parse_options(cls, options: argparse.Namespace) -> None:
        """Keep only the TGL rules that flake8's select/ignore lets through."""
        try:
            from flake8.style_guide import Decision, DecisionEngine

            engine = DecisionEngine(options)
            cls._rules = [r for r in all_rules() if engine.decision_for(r.code) is Decision.Selected]
        except Exception:  # an unusual flake8: fall back to every default rule
            cls._rules = [r for r in all_rules() if r.default_enabled]

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        """Yield flake8's ``(line, col, message, type)`` tuples; ``col`` 0-based."""
        rules = self._rules if self._rules is not None else [r for r in all_rules() if r.default_enabled]
        if not rules:
            return
        source = "".join(self.lines)
        result = lint_source(source, self.filename, rules, apply_noqa=False)
        for d in result.diagnostics:
            yield d.line, d.col - 1, f"{d.code} {d.message}", type(self)
