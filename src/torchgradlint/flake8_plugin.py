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
Standard input (``flake8 -``) gets the config of ``--stdin-display-name``'s
folder, or of the current folder without one, as ``torchgradlint check -``.

A ``TGL`` selector in flake8's ``--select``/``--extend-select``/``--ignore``/
``--extend-ignore`` that names no rule (``--select TGL999``) stops flake8 with
a usage error on standard error and exit status 2 (through flake8's own
argument parser), as the CLI rejects it.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from . import __version__
from .rules import RULE_CODES

if TYPE_CHECKING:  # pragma: no cover
    from .limits import Budget
    from .registry import Rule


_SELECTOR_OPTIONS = ("select", "extend_select", "ignore", "extend_ignore")


def unknown_selectors(options: argparse.Namespace) -> list[str]:
    """``TGL`` entries of flake8's select/ignore options that are a prefix of
    no rule code (``TGL000``, the parse-error code, is known)."""
    known = (*RULE_CODES, "TGL000")
    out = []
    for name in _SELECTOR_OPTIONS:
        for sel in getattr(options, name, None) or ():
            sel = str(sel).strip().upper()
            if sel.startswith("TGL") and not any(code.startswith(sel) for code in known) and sel not in out:
                out.append(sel)
    return out


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
    def parse_options(cls, option_manager: Any, options: "argparse.Namespace | None" = None,
                      args: Any = None) -> None:
        """Reject unknown ``TGL`` selectors, then keep only the TGL codes that
        flake8's select/ignore lets through (decided on
        :data:`~torchgradlint.rules.RULE_CODES`, without importing the rules).

        Exits (status 2, through ``option_manager.parser.error``) when a
        ``TGL`` selector matches no rule. Called by flake8 as
        ``(option_manager, options, filenames)``; ``(options)`` alone works too.
        """
        if options is None:  # the one-argument form
            options, option_manager = option_manager, None
        unknown = unknown_selectors(options)
        if unknown:
            message = (f"torchgradlint: unknown rule selector(s) {', '.join(map(repr, unknown))}: expected a "
                       f"code or code prefix of {', '.join(RULE_CODES)}")
            parser = getattr(option_manager, "parser", None)
            if parser is None:
                import sys

                print(f"flake8: error: {message}", file=sys.stderr)
                raise SystemExit(2)
            parser.error(message)
        try:
            from flake8.style_guide import Decision, DecisionEngine

            engine = DecisionEngine(options)
            cls._codes = tuple(c for c in RULE_CODES if engine.decision_for(c) is Decision.Selected)
        except Exception:  # an unusual flake8: fall back to every default rule
            cls._codes = None

    @classmethod
    def _selected_rules(cls) -> list[type["Rule"]]:
        from .registry import all_rules

        if cls._codes is None:
            return [r for r in all_rules() if r.default_enabled]
        return [r for r in all_rules() if r.code in cls._codes]

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        """Yield flake8's ``(line, col, message, type)`` tuples; ``col`` 0-based."""
        if self._codes == ():
            return
        source = "".join(self.lines)
        if self._ruled_out(source):
            return
        from .config import ConfigError
        from .diagnostics import PARSE_ERROR_CODE

        try:
            budget = self._budget()
        except ConfigError as exc:
            yield 1, 0, f"{PARSE_ERROR_CODE} {exc}", type(self)
            return
        size = len(source.encode("utf-8", "surrogatepass"))
        if budget.too_large(size):
            from .limits import size_diagnostic

            d = size_diagnostic(self.filename, size, budget)
            yield d.line, d.col - 1, f"{d.code} {d.message}", type(self)
            return
        from . import engine

        rules = self._selected_rules()
        try:
            rules = self._narrow_by_config(rules)
        except ConfigError as exc:
            yield 1, 0, f"{PARSE_ERROR_CODE} {exc}", type(self)
            return
        if not rules:
            return
        result = engine.lint_source(source, self.filename, rules, apply_noqa=False,
                                    tree=self.tree if isinstance(self.tree, ast.Module) else None)
        for d in result.diagnostics:
            yield d.line, d.col - 1, f"{d.code} {d.message}", type(self)

    def _ruled_out(self, source: str) -> bool:
        """Whether the prefilter rules the file out for every selected code,
        decided on :data:`~torchgradlint.rules.RULE_PREFILTER`: no rule, no
        LibCST and no analysis is imported for such a file."""
        from .prefilter import PrefilterSpec, candidate_rules
        from .rules import RULE_PREFILTER

        codes = RULE_CODES if self._codes is None else self._codes
        specs = [PrefilterSpec(c, *RULE_PREFILTER[c]) for c in codes if c in RULE_PREFILTER]
        tree = self.tree if isinstance(self.tree, ast.Module) else None
        return not candidate_rules(source, specs, tree)

    def _budget(self) -> "Budget":
        """The size budget of this file: its ``[tool.torchgradlint]``
        ``max-file-size``, else the default. (flake8 lints in its own
        process: the time budget of the CLI's workers does not apply; a file
        CPython cannot parse never reaches the plugin.)

        Raises:
            ConfigError: the table is malformed.
        """
        from .config import Settings

        if self.filename in ("-", "stdin", ""):
            from .limits import DEFAULT_BUDGET

            return DEFAULT_BUDGET
        return Settings().budget_for(self.filename)

    def _narrow_by_config(self, rules: list[type["Rule"]]) -> list[type["Rule"]]:
        """Drop rules that the ``[tool.torchgradlint]`` table switches off for this file.

        Raises:
            ConfigError: the table is malformed.
        """
        from .config import RuleLayer, find_config, resolve_rules

        path = Path(self.filename)
        if self.filename in ("-", "stdin", ""):  # standard input without --stdin-display-name
            path = Path.cwd() / "-"
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
