"""Apply autofixes: rule-provided span replacements, safest first.

Guarantees (tested): only the flagged span changes, every byte outside the
applied edits is untouched, the result parses, and a second run changes
nothing (idempotence, reached by re-linting until no fix applies).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Callable, Sequence

import libcst as cst

from .diagnostics import Diagnostic, Fix

MAX_ROUNDS = 10


@dataclass
class FixResult:
    """The fixed text and the diagnostics whose fixes were applied."""

    source: str
    applied: list[Diagnostic] = field(default_factory=list)

    def changed(self, original: str) -> bool:
        """Whether the text differs from ``original``."""
        return self.source != original


def _offsets(source: str) -> list[int]:
    """Offset of the first character of each 1-based line (index 0 unused)."""
    starts = [0, 0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _span(starts: list[int], fix: Fix) -> tuple[int, int]:
    (l1, c1), (l2, c2) = fix.start, fix.end
    return starts[l1] + c1 - 1, starts[l2] + c2 - 1


def apply_edits(source: str, diagnostics: Sequence[Diagnostic], unsafe: bool = False) -> FixResult:
    """Apply the non-overlapping fixes of ``diagnostics`` to ``source`` once.

    Unsafe fixes apply only with ``unsafe=True``. When two fixes overlap the
    later one waits for the next round. If the edited text would not parse,
    nothing is applied.
    """
    starts = _offsets(source)
    chosen: list[tuple[int, int, Diagnostic]] = []
    for d in sorted((d for d in diagnostics if d.fix is not None), key=lambda d: d.sort_key):
        assert d.fix is not None
        if not d.fix.safe and not unsafe:
            continue
        lo, hi = _span(starts, d.fix)
        if any(lo < h and l < hi for l, h, _ in chosen):
            continue
        chosen.append((lo, hi, d))
    if not chosen:
        return FixResult(source)
    out = source
    for lo, hi, d in sorted(chosen, key=lambda t: t[0], reverse=True):
        assert d.fix is not None
        out = out[:lo] + d.fix.replacement + out[hi:]
    try:
        cst.parse_module(out)
    except cst.ParserSyntaxError:
        return FixResult(source)
    return FixResult(out, [d for _, _, d in chosen])


def fix_until_stable(source: str, lint: Callable[[str], Sequence[Diagnostic]], unsafe: bool = False) -> FixResult:
    """Lint, apply fixes, and repeat until no fix applies (at most
    :data:`MAX_ROUNDS` rounds), so one run reaches the fixed point."""
    current = FixResult(source)
    for _ in range(MAX_ROUNDS):
        step = apply_edits(current.source, lint(current.source), unsafe)
        if not step.applied:
            break
        current = FixResult(step.source, current.applied + step.applied)
    return current


def unified_diff(path: str, before: str, after: str) -> str:
    """A unified diff of one file's fix, as ``--diff`` prints it."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True),
                                        fromfile=f"a/{path.lstrip('/')}", tofile=f"b/{path.lstrip('/')}"))


@dataclass
class FileFix:
    """Outcome of fixing one file: text before and after, the fixes applied
    and the diagnostics that remain."""

    path: str
    before: str
    after: str
    applied: list[Diagnostic]
    remaining: list[Diagnostic]


def fix_file(path: str, rules: Sequence, unsafe: bool = False, write: bool = True) -> FileFix:
    """Fix one file in place (``write=True``) or only compute the fix.

    Raises:
        OSError: the file cannot be read or written.
        UnicodeDecodeError: the file is not valid in its declared encoding.
    """
    from .engine import decode_source, lint_source

    with open(path, "rb") as fh:
        data = fh.read()
    before = decode_source(data)

    def lint(text: str) -> Sequence[Diagnostic]:
        return lint_source(text, path, rules).diagnostics

    result = fix_until_stable(before, lint, unsafe)
    if write and result.changed(before):
        # keep the file's newline convention: splitlines/parse round-trips text, not bytes
        with open(path, "w", encoding="utf-8", newline="") as fh:
            fh.write(result.source)
    return FileFix(path, before, result.source, result.applied, list(lint(result.source)))
