"""Lint many files: in-process for a few, a process pool sized to the cores
for many. A crash inside a rule is reported per file, never as a traceback.
Each file may get its own rule set (from its ``[tool.torchgradlint]`` config);
notebooks (``.ipynb``) go through :mod:`torchgradlint.notebook`."""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

from .diagnostics import PARSE_ERROR_CODE, Diagnostic, read_file
from .registry import Rule, get_rule

if TYPE_CHECKING:  # pragma: no cover
    from .cache import Cache, EntryKey

# Below this many files the pool's start-up costs more than it saves.
POOL_THRESHOLD = 16


@dataclass
class RunResult:
    """Diagnostics of all files, sorted; internal errors as messages."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    internal_errors: list[str] = field(default_factory=list)
    files: int = 0
    parsed: int = 0


def order_key(d: Diagnostic) -> tuple[str, int, int, int, str]:
    """Output order: path, notebook cell, line, column, code."""
    return (d.path, d.cell or 0, d.line, d.col, d.code)


def _lint_one(args: tuple) -> tuple[list[Diagnostic], bool, Optional[str]]:
    """Worker: ``(path, codes[, data])`` -> ``(diagnostics, parsed, internal error)``."""
    from .engine import lint_data, lint_file

    path, codes = args[0], args[1]
    data = args[2] if len(args) > 2 else None
    rules = [get_rule(c) for c in codes]
    try:
        result = lint_file(path, rules) if data is None else lint_data(data, path, rules)
    except Exception as exc:  # a bug in a rule: report it for this file, keep going
        return ([internal_error(path, exc)], False,
                f"{path}: internal error while linting (please report):\n{traceback.format_exc()}")
    return result.diagnostics, result.parsed, None


def internal_error(path: str, exc: BaseException) -> Diagnostic:
    """The ``TGL000`` diagnostic of a file whose linting crashed (a bug in
    torchgradlint: the traceback goes to standard error, the run exits 2)."""
    reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return Diagnostic(PARSE_ERROR_CODE, f"internal error, so the file was not linted (please report): {reason}",
                      path, 1, 1, 1, 1)


def default_jobs() -> int:
    """Worker processes for a run: the usable cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def lint_paths(
    files: Sequence[str],
    rules: Sequence[type[Rule]],
    jobs: Optional[int] = None,
    *,
    codes_for: Optional[Callable[[str], Sequence[str]]] = None,
    progress: Optional[Callable[[], None]] = None,
    cache: "Optional[Cache]" = None,
    selection_for: Optional[Callable[[str], str]] = None,
    before_linting: Optional[Callable[[], None]] = None,
) -> RunResult:
    """Lint ``files``; ``jobs`` worker processes (default: cores).

    Args:
        files: paths to lint (Python files or notebooks).
        rules: the rules for every file, unless ``codes_for`` is given.
        jobs: worker processes; the pool is used only for many files.
        codes_for: per-file rule codes (config-aware); overrides ``rules``.
            Called in this process, so it may raise (e.g. a config error).
        progress: called once per finished file (for a progress bar).
        cache: content-hash cache; files whose entry exists are not linted;
            saved once, when the run ends.
        selection_for: per-file text that determines the rule selection
            (part of the cache key; default: the rule codes).
        before_linting: called once before linting, unless the cache answers
            the whole run (entries exist only for valid settings); may raise
            (e.g. to validate selectors).
    """
    codes = tuple(r.code for r in rules)
    out = RunResult(files=len(files))
    pending: "list[tuple[str, Optional[bytes], Optional[EntryKey]]]" = []
    hits = 0
    for f in files:
        if cache is None:
            pending.append((f, None, None))
            continue
        data = read_file(f)
        if not isinstance(data, bytes):
            out.diagnostics.extend(data.diagnostics)
            _tick(progress)
            continue
        selection = selection_for(f) if selection_for is not None else ",".join(codes)
        key = cache.key(data, f, selection)
        hit = cache.get(key, f)
        if hit is not None:
            out.diagnostics.extend(hit[0])
            out.parsed += hit[1]
            hits += 1
            _tick(progress)
        else:
            pending.append((f, data, key))
    if before_linting is not None and (pending or not hits):
        before_linting()
    by_size = sorted(pending, key=lambda p: -_size(p[0], p[1]))
    work = [(f, tuple(codes_for(f)) if codes_for is not None else codes) + ((data,) if data is not None else ())
            for f, data, _ in by_size]
    jobs = jobs or default_jobs()
    results: Iterable
    pool = None
    if jobs > 1 and len(work) >= POOL_THRESHOLD:
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(max_workers=jobs)
        results = pool.map(_lint_one, work, chunksize=max(1, min(8, len(work) // (jobs * 8))))
    else:
        results = map(_lint_one, work)
    try:
        for (f, _, key), (diags, parsed, err) in zip(by_size, results):
            out.diagnostics.extend(diags)
            out.parsed += parsed
            if err:
                out.internal_errors.append(err)
            elif cache is not None and key is not None:
                cache.put(key, diags, parsed)
            _tick(progress)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if cache is not None:
            cache.save()
    out.diagnostics.sort(key=order_key)
    return out


def _tick(progress: Optional[Callable[[], None]]) -> None:
    if progress is not None:
        progress()


def _size(path: str, data: Optional[bytes]) -> int:
    if data is not None:
        return len(data)
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
