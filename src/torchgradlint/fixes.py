"""Apply autofixes: rule-provided span replacements, safest first.

Guarantees (tested): only the flagged span changes, every byte outside the
applied edits is untouched, the result parses, and a second run changes
nothing (idempotence, reached by re-linting until no fix applies).
"""

from __future__ import annotations

import difflib
import tokenize
from dataclasses import dataclass, field
from typing import Callable, Sequence

import libcst as cst

from .diagnostics import Diagnostic, Fix
from .lines import bytes_readline, line_starts, split_lines
from .notebook import without_ipython_syntax

MAX_ROUNDS = 10


@dataclass
class FixResult:
    """The fixed text and the diagnostics whose fixes were applied."""

    source: str
    applied: list[Diagnostic] = field(default_factory=list)

    def changed(self, original: str) -> bool:
        """Whether the text differs from ``original``."""
        return self.source != original


def _span(starts: list[int], fix: Fix) -> tuple[int, int]:
    (l1, c1), (l2, c2) = fix.start, fix.end
    return starts[l1] + c1 - 1, starts[l2] + c2 - 1


def apply_edits(source: str, diagnostics: Sequence[Diagnostic], unsafe: bool = False) -> FixResult:
    """Apply the non-overlapping fixes of ``diagnostics`` to ``source`` once.

    Unsafe fixes apply only with ``unsafe=True``. When two fixes overlap the
    later one waits for the next round. If the edited text would not parse,
    nothing is applied.
    """
    starts = line_starts(source)
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
    if not _parses(out):
        return FixResult(source)
    return FixResult(out, [d for _, _, d in chosen])


def _parses(text: str) -> bool:
    """Whether LibCST parses ``text``, or its Python once its IPython lines
    are replaced (a notebook exported as a script keeps ``%matplotlib
    inline`` and ``!pip install``: the engine lints such a file that way)."""
    for candidate in (text, without_ipython_syntax(text)):
        if candidate is None:
            continue
        try:
            cst.parse_module(candidate)
        except cst.ParserSyntaxError:
            continue
        return True
    return False


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
    return "".join(difflib.unified_diff(split_lines(before, True), split_lines(after, True),
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


class UnfixableFile(ValueError):
    """The file's text cannot be written back byte for byte (its bytes do not
    round-trip through its declared encoding, or a fix's text is not
    encodable in it), so it is left alone."""


def source_encoding(data: bytes) -> str:
    """The encoding Python reads ``data`` in (PEP 263 cookie or BOM, else
    UTF-8); ``utf-8-sig`` when a UTF-8 BOM starts the file.

    Raises:
        SyntaxError: the cookie names an unknown codec, or contradicts the BOM.
    """
    return tokenize.detect_encoding(bytes_readline(data))[0]


def encode_like(text: str, data: bytes) -> tuple[str, bytes]:
    """``(encoding, bytes)``: ``text`` encoded as the original file ``data`` is
    (same declared encoding, same BOM), so every byte outside the fixed spans
    stays identical. Line endings are part of the text and kept as they are.

    Raises:
        UnfixableFile: ``data`` is not what decoding and re-encoding gives
            (nothing could be written without changing other bytes), or
            ``text`` holds a character the encoding cannot represent.
    """
    from .engine import decode_source

    encoding = source_encoding(data)
    try:
        if decode_source(data).encode(encoding) != data:  # utf-8-sig writes the BOM back
            raise UnfixableFile(f"its bytes do not round-trip through its encoding ({encoding})")
        return encoding, text.encode(encoding)
    except UnicodeEncodeError as exc:
        raise UnfixableFile(f"a fix is not representable in the file's encoding ({encoding}): {exc.reason}") \
            from None


def fix_file(path: str, rules: Sequence, unsafe: bool = False, write: bool = True) -> FileFix:
    """Fix one file in place (``write=True``) or only compute the fix.

    The file is written back in its own encoding, with its BOM and its line
    endings: only the bytes of the applied edits change.

    Raises:
        OSError: the file cannot be read or written.
        UnicodeDecodeError: the file is not valid in its declared encoding.
        SyntaxError: its encoding cookie names an unknown codec.
        UnfixableFile: it cannot be written back byte for byte.
    """
    from .engine import decode_source, lint_source

    with open(path, "rb") as fh:
        data = fh.read()
    before = decode_source(data)

    def lint(text: str) -> Sequence[Diagnostic]:
        return lint_source(text, path, rules).diagnostics

    result = fix_until_stable(before, lint, unsafe)
    if result.changed(before):
        _, out = encode_like(result.source, data)
        if write:
            with open(path, "wb") as fh:
                fh.write(out)
    return FileFix(path, before, result.source, result.applied, list(lint(result.source)))
