"""Lint many files: in-process for a few, a process pool sized to the cores
for many. A crash inside a rule is reported per file, never as a traceback."""

from __future__ import annotations

import os
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

from .diagnostics import Diagnostic
from .engine import lint_file
from .registry import Rule, get_rule

# Below this many files the pool's start-up costs more than it saves.
POOL_THRESHOLD = 16


@dataclass
class RunResult:
    """Diagnostics of all files, sorted; internal errors as messages."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    internal_errors: list[str] = field(default_factory=list)
    files: int = 0
    parsed: int = 0


def _lint_one(args: tuple[str, tuple[str, ...]]) -> tuple[list[Diagnostic], bool, Optional[str]]:
    path, codes = args
    rules = [get_rule(c) for c in codes]
    try:
        result = lint_file(path, rules)
    except Exception:  # a bug in a rule: report it for this file, keep going
        return [], False, f"{path}: internal error while linting (please report):\n{traceback.format_exc()}"
    return result.diagnostics, result.parsed, None


def default_jobs() -> int:
    """Worker processes for a run: the usable cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def _by_size(files: Sequence[str]) -> list[str]:
    """Largest files first, so the pool does not end waiting on one big file."""
    def size(p: str) -> int:
        try:
            return os.path.getsize(p)
        except OSError:
            return 0
    return sorted(files, key=size, reverse=True)


def lint_paths(files: Sequence[str], rules: Sequence[type[Rule]], jobs: Optional[int] = None) -> RunResult:
    """Lint ``files`` with ``rules``; ``jobs`` worker processes (default: cores)."""
    codes = tuple(r.code for r in rules)
    jobs = jobs or default_jobs()
    work = [(f, codes) for f in _by_size(files)]
    out = RunResult(files=len(files))
    results: Iterable
    if jobs > 1 and len(work) >= POOL_THRESHOLD:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            results = list(pool.map(_lint_one, work, chunksize=max(1, len(work) // (jobs * 8))))
    else:
        results = map(_lint_one, work)
    for diags, parsed, err in results:
        out.diagnostics.extend(diags)
        out.parsed += parsed
        if err:
            out.internal_errors.append(err)
    out.diagnostics.sort(key=lambda d: d.sort_key)
    return out
