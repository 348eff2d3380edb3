"""flake8 plugin (entry point ``TGL`` under ``flake8.extension``).

A thin adapter: source lines → the engine → ``(line, 0-based col, "TGL001
message", type)``. flake8 applies ``# noqa`` itself in this mode. When
flake8's own select/ignore decision excludes every TGL rule, the plugin
returns at once without parsing.

flake8's own config decides which TGL rules run (select, ignore,
per-file-ignores, exclude). The nearest ``[tool.torchgradlint]`` table in
``pyproject.toml`` (cached per folder) can only narrow that: its ``ignore``,
``per-file-ignores`` and ``exclude``/``extend-exclude`` apply too. A malformed
table gives one ``TGL000`` result on line 1 instead of crashing flake8.
"""

from __future__ import annotations

import argparse
from typing import Any, Iterator

from pathlib import Path

from . import __version__
from .config import ConfigError, find_config, resolve_rules, RuleLayer
from .diagnostics import PARSE_ERROR_CODE
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
        try:
            rules = self._narrow_by_config(rules)
        except ConfigError as exc:
            yield 1, 0, f"{PARSE_ERROR_CODE} {exc}", type(self)
            return
        if not rules:
            return
        source = "".join(self.lines)
        result = lint_source(source, self.filename, rules, apply_noqa=False)
        for d in result.diagnostics:
            yield d.line, d.col - 1, f"{d.code} {d.message}", type(self)

    def _narrow_by_config(self, rules: list[type[Rule]]) -> list[type[Rule]]:
        """Drop rules that the ``[tool.torchgradlint]`` table switches off for this file."""
        if self.filename in ("-", "stdin", ""):
            return rules
        path = Path(self.filename)
        cfg = find_config(path)
        if cfg is None:
            return rules
        if cfg.exclude is not None or cfg.extend_exclude:
            if cfg.excludes(path, False):  # gitignore semantics: "dir/" covers files below it
                return []
        off = set(cfg.rules.ignore) | set(cfg.ignored_selectors(path))
        if not off:
            return rules
        allowed = {r.code for r in resolve_rules([RuleLayer(select=("ALL",), ignore=tuple(sorted(off)))])}
        return [r for r in rules if r.code in allowed]
