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

When TGL codes are selected and flake8 forks its pool of worker processes
(several files, ``--jobs`` above 1), the engine and the rules are imported
once in flake8's main process just before the fork
(:func:`_preload_before_pool_fork`), so the workers inherit them instead of
each importing LibCST again (about 0.13-0.25 s of CPU per worker), and moved
to the collector's permanent generation (``gc.freeze``). A
single-file run never forks and imports nothing for a file the prefilter
rules out.
"""

from __future__ import annotations

import argparse
import ast
import gc
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from . import __version__

if TYPE_CHECKING:  # pragma: no cover
    from typing import Optional

    from .limits import Budget
    from .prefilter import FileFacts
    from .project_index import ProjectIndex

_MARKERS: dict[str, bool] = {}  # folder -> holds a project marker, for this flake8 process
_CACHE: dict[str, Any] = {}  # "default" -> the cache folder the project index's summaries live in


_SELECTOR_OPTIONS = ("select", "extend_select", "ignore", "extend_ignore")


def _rule_codes() -> tuple[str, ...]:
    """Every rule code, from the generated rule index (imports no rule)."""
    from .registry import rule_index

    return tuple(r.code for r in rule_index())


def unknown_selectors(options: argparse.Namespace) -> list[str]:
    """``TGL`` entries of flake8's select/ignore options that are a prefix of
    no rule code (``TGL000``, the parse-error code, is known)."""
    known = (*_rule_codes(), "TGL000")
    out = []
    for name in _SELECTOR_OPTIONS:
        for sel in getattr(options, name, None) or ():
            sel = str(sel).strip().upper()
            if sel.startswith("TGL") and not any(code.startswith(sel) for code in known) and sel not in out:
                out.append(sel)
    return out


_preload_hooked = False


def _preload_before_pool_fork() -> None:
    """``os.register_at_fork(before=...)`` hook: import the engine and the
    rules in flake8's main process when the fork is flake8's own worker pool
    (inside ``flake8.checker._mp_prefork``), so that every worker inherits
    them. Any other fork (a subprocess, another library) is left alone."""
    checker = sys.modules.get("flake8.checker")
    if getattr(checker, "_mp", None) is None or "torchgradlint.engine" in sys.modules:
        return
    try:
        from . import engine  # noqa: F401
        from .registry import all_rules

        all_rules()
        # Python's advice before a fork: the imported objects then sit in the permanent
        # generation, so the workers' collections neither walk them (about 0.08 s of CPU over
        # pytorch/examples) nor copy their pages.
        gc.freeze()
    except Exception:  # pragma: no cover - the worker imports them itself then
        pass


def _hook_preload() -> None:
    """Register :func:`_preload_before_pool_fork` once per process."""
    global _preload_hooked
    if not _preload_hooked and hasattr(os, "register_at_fork"):
        os.register_at_fork(before=_preload_before_pool_fork)
        _preload_hooked = True


class Plugin:
    """flake8 AST-plugin shape. flake8's ``tree`` (Python's ``ast``) feeds
    only the prefilter's second stage; findings come from the LibCST parse."""

    name = "torchgradlint"
    version = __version__
    _codes: tuple[str, ...] | None = None  # TGL codes flake8 selects; None: not decided yet
    _facts: "FileFacts | None" = None  # the prefilter's facts of the file being linted (``_ruled_out``)
    # Per process, for the files after the first: the prefilter specs of the
    # selected codes, and the codes per (selection, config, ignores).
    _specs: dict[tuple[str, ...] | None, list[Any]] = {}
    _resolved: dict[tuple, tuple[str, ...]] = {}

    def __init__(self, tree: Any, lines: list[str], filename: str) -> None:
        self.tree = tree
        self.lines = lines
        self.filename = filename

    @classmethod
    def parse_options(cls, option_manager: Any, options: "argparse.Namespace | None" = None,
                      args: Any = None) -> None:
        """Reject unknown ``TGL`` selectors, then keep only the TGL codes that
        flake8's select/ignore lets through (decided on
        :mod:`torchgradlint.rule_index`, without importing the rules).

        Exits (status 2, through ``option_manager.parser.error``) when a
        ``TGL`` selector matches no rule. Called by flake8 as
        ``(option_manager, options, filenames)``; ``(options)`` alone works too.
        """
        if options is None:  # the one-argument form
            options, option_manager = option_manager, None
        unknown = unknown_selectors(options)
        if unknown:
            message = (f"torchgradlint: unknown rule selector(s) {', '.join(map(repr, unknown))}: expected a "
                       f"code or code prefix of {', '.join(_rule_codes())}")
            parser = getattr(option_manager, "parser", None)
            if parser is None:
                print(f"flake8: error: {message}", file=sys.stderr)
                raise SystemExit(2)
            parser.error(message)
        try:
            from flake8.style_guide import Decision, DecisionEngine

            from .registry import rule_index

            engine = DecisionEngine(options)
            cls._codes = tuple(r.code for r in rule_index() if engine.decision_for(r.code) is Decision.Selected)
        except Exception:  # an unusual flake8: fall back to every default rule
            cls._codes = None
        if cls._codes != ():
            _hook_preload()

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
        from .registry import get_rule

        try:
            codes = self.selected_codes()
        except ConfigError as exc:
            yield 1, 0, f"{PARSE_ERROR_CODE} {exc}", type(self)
            return
        if not codes:
            return
        project = self._project()
        result = engine.lint_source(source, self.filename, [get_rule(c) for c in codes], apply_noqa=False,
                                    project=project, facts=self._facts)
        if project is not None and project.fresh:
            project.save(_CACHE["default"])
        for d in result.diagnostics:
            yield d.line, d.col - 1, f"{d.code} {d.message}", type(self)

    def _ruled_out(self, source: str) -> bool:
        """Whether the prefilter rules the file out for every selected code,
        decided on :mod:`torchgradlint.rule_index`: no rule, no LibCST and no
        analysis is imported for such a file (unless a decorator or an
        imported model class of the file must be looked up in the project
        index: :func:`~torchgradlint.project_index.revived_rules`)."""
        from .prefilter import FileFacts, PrefilterSpec, candidate_rules
        from .registry import rule_index

        specs = self._specs.get(self._codes)
        if specs is None:
            specs = self._specs[self._codes] = [
                PrefilterSpec(r.code, r.prefilter, r.needs_backward, r.needs_grad_evidence, r.ast_prefilter)
                for r in rule_index()
                if self._codes is None or r.code in self._codes]
        tree = self.tree if isinstance(self.tree, ast.Module) else None
        self._facts = FileFacts(source, tree)  # shared with the engine (tree, call scan, verdicts)
        if candidate_rules(source, specs, facts=self._facts):
            return False
        from .project_index import revived_rules

        run, _ = revived_rules(self._project, self.filename, source, specs, [], self._facts, {})
        return not run

    def _project(self) -> "Optional[ProjectIndex]":
        """The project index of this file: the one of the nearest folder
        with a ``pyproject.toml``/``setup.py``/``setup.cfg``/``.git``, its
        summaries read from (and new ones written to) the default cache
        folder, one per process (:func:`torchgradlint.project_index.open_index`);
        ``None`` for standard input, outside a project, or when the config
        says ``project-index = false``. A malformed config gives ``None``
        (:meth:`selected_codes` reports it)."""
        if self.filename in ("-", "stdin", ""):
            return None
        from .cache import Cache
        from .config import ConfigError, Settings
        from .project_index import find_root, open_index, store_path

        try:
            if not Settings().uses_project_index(self.filename):
                return None
        except ConfigError:
            return None
        root = find_root(self.filename, memo=_MARKERS)
        if root is None:
            return None
        cache = _CACHE.get("default")
        if cache is None:
            cache = _CACHE["default"] = Cache.default()  # its fingerprint stats the package: once per process
        return open_index(root, store_path(cache, root))

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
        path = Path(self.filename)
        if self.filename in ("-", "stdin", ""):  # standard input without --stdin-display-name
            path = Path.cwd() / "-"
        cfg = find_config(path)
        if cfg is None:
            key: tuple = (self._codes,)
            if key not in self._resolved:
                self._resolved[key] = resolve_codes(layers)
            return self._resolved[key]
        if cfg.exclude is not None or cfg.extend_exclude:
            if cfg.excludes(path, False):  # gitignore semantics: "dir/" covers files below it
                return ()
        ignored = tuple(cfg.ignored_selectors(path))
        key = (self._codes, tuple(cfg.rules.ignore), ignored)
        if key not in self._resolved:
            self._resolved[key] = resolve_codes(layers + [RuleLayer(ignore=cfg.rules.ignore)], ignored)
        return self._resolved[key]
