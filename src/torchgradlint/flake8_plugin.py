"""flake8 plugin (entry point ``TGL`` under ``flake8.extension``).

A thin adapter: source lines → the engine → ``(line, 0-based col, "TGL001
message", type)``. flake8 applies ``# noqa`` itself in this mode. When
flake8's own select/ignore decision excludes every TGL rule, the plugin
returns at once: it imports neither the rules nor LibCST (flake8 imports every
installed plugin on every run, so this module's own imports are kept light).

flake8's own config decides which TGL rules run (select, ignore,
per-file-ignores, exclude). The nearest ``[tool.torchgradlint]`` table in
``pyproject.toml`` (cached per folder) can only narrow that: its ``ignore``,
``per-file-ignores`` and ``exclude``/``extend-exclude`` apply too. A malformed
table gives one ``TGL000`` result on line 1 instead of crashing flake8.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any, Iterator

from . import __version__


class Plugin:
    """flake8 AST-plugin shape. flake8's ``tree`` (Python's ``ast``) feeds
    only the prefilter's second stage; findings come from the LibCST parse."""

    name = "torchgradlint"
    version = __version__
    _codes: tuple[str, ...] | None = None  # TGL codes flake8 selects; None: not decided yet

    def __init__(self, tree: Any, lines: list[str], filename: str) -> None:
        self.tree = tree
        self.lines = lines
        self.filename = filename

    @classmethod
    def parse_options(cls, options: argparse.Namespace) -> None:
        """Keep only the TGL codes that flake8's select/ignore lets through
        (decided on :mod:`torchgradlint.rule_index`, without importing the rules)."""
        try:
            from flake8.style_guide import Decision, DecisionEngine

            from .registry import rule_index

            engine = DecisionEngine(options)
            cls._codes = tuple(r.code for r in rule_index() if engine.decision_for(r.code) is Decision.Selected)
        except Exception:  # an unusual flake8: fall back to every default rule
            cls._codes = None

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        """Yield flake8's ``(line, col, message, type)`` tuples; ``col`` 0-based."""
        if self._codes == ():
            return
        from . import engine
        from .config import ConfigError
        from .diagnostics import PARSE_ERROR_CODE
        from .registry import get_rule

        try:
            codes = self.selected_codes()
        except ConfigError as exc:
            yield 1, 0, f"{PARSE_ERROR_CODE} {exc}", type(self)
            return
        if not codes:
            return
        source = "".join(self.lines)
        result = engine.lint_source(source, self.filename, [get_rule(c) for c in codes], apply_noqa=False,
                                    tree=self.tree if isinstance(self.tree, ast.Module) else None)
        for d in result.diagnostics:
            yield d.line, d.col - 1, f"{d.code} {d.message}", type(self)

    def selected_codes(self) -> tuple[str, ...]:
        """The codes to run on this file: flake8's selection (the default
        rules when it is unknown), narrowed by the nearest
        ``[tool.torchgradlint]`` table's ``ignore``, ``per-file-ignores`` and
        excludes. Imports no rule.

        Raises:
            ConfigError: the table is malformed.
        """
        from .config import find_config
        from .registry import RuleLayer, resolve_codes

        layers = [] if self._codes is None else [RuleLayer(select=self._codes)]
        if self.filename in ("-", "stdin", ""):
            return resolve_codes(layers)
        path = Path(self.filename)
        cfg = find_config(path)
        if cfg is None:
            return resolve_codes(layers)
        if cfg.exclude is not None or cfg.extend_exclude:
            if cfg.excludes(path, False):  # gitignore semantics: "dir/" covers files below it
                return ()
        return resolve_codes(layers + [RuleLayer(ignore=cfg.rules.ignore)], cfg.ignored_selectors(path))
