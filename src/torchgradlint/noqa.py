"""``# noqa`` and ``# noqa: TGL001[,TGL101]`` comments, exactly as flake8 reads them.

The CLI applies the same regular expression and the same line mapping as
flake8 (a comment anywhere on a multi-line string's lines covers all of them),
so a finding is silenced in CLI mode iff flake8 would silence it.
"""

from __future__ import annotations

import io
import re
import tokenize
from typing import Iterable

from .lines import normalize_newlines, split_lines

# flake8.defaults.NOQA_INLINE_REGEXP
NOQA_INLINE = re.compile(r"# noqa(?::[\s]?(?P<codes>([A-Z]+[0-9]+(?:[,\s]+)?)+))?", re.IGNORECASE)
_SPLIT = re.compile(r"[,\s]")


def _line_mapping(source: str) -> dict[int, str]:
    """Line number → the text searched for ``noqa`` (flake8's mapping)."""
    source = normalize_newlines(source)  # tokenize splits at "\n" only; line numbers are kept
    lines = split_lines(source, keepends=True)
    mapping: dict[int, str] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return {i + 1: line for i, line in enumerate(lines)}
    lo, hi = len(lines) + 2, -1
    for tok in tokens:
        if tok.type in (tokenize.ENDMARKER, tokenize.DEDENT):
            continue
        lo = min(lo, tok.start[0])
        hi = max(hi, tok.end[0])
        if tok.type in (tokenize.NL, tokenize.NEWLINE):
            joined = "".join(lines[lo - 1:hi])
            for n in range(lo, hi + 1):
                mapping[n] = joined
            lo, hi = len(lines) + 2, -1
    return mapping


def is_suppressed(code: str, text: str) -> bool:
    """Whether the ``noqa`` comments in ``text`` silence ``code``.

    A bare ``# noqa`` silences every code; ``# noqa: TGL0`` silences codes
    starting with ``TGL0`` (flake8's prefix match).
    """
    for match in NOQA_INLINE.finditer(text):
        codes_str = match.group("codes")
        if not codes_str:
            return True
        codes = {c for c in _SPLIT.split(codes_str.upper()) if c}
        if code in codes or code.startswith(tuple(codes)):
            return True
    return False


class NoqaFilter:
    """Answers "is line N's finding of CODE silenced?" for one source text."""

    def __init__(self, source: str) -> None:
        self._source = source
        self._mapping: dict[int, str] | None = None

    def suppressed(self, code: str, line: int) -> bool:
        """Whether a finding of ``code`` reported on 1-based ``line`` is silenced."""
        if "noqa" not in self._source.lower():
            return False
        if self._mapping is None:
            self._mapping = _line_mapping(self._source)
        return is_suppressed(code, self._mapping.get(line, ""))

    def filter(self, diagnostics: Iterable) -> list:
        """Keep the diagnostics that no ``noqa`` comment silences."""
        return [d for d in diagnostics if not self.suppressed(d.code, d.line)]
