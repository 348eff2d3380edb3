"""Source lines as Python sees them.

Python's tokenizer, LibCST and flake8 end a line only at ``\\n``, ``\\r\\n`` or
``\\r``. :meth:`str.splitlines` also breaks at form feed, vertical tab,
``\\x1c``-``\\x1e``, NEL (``\\x85``) and U+2028/U+2029, which may sit in
comments and strings; a line number or an autofix offset computed with it
lands on the wrong text. Every place that maps a 1-based line number (as
LibCST and the parser report them) to text uses this module instead.
"""

from __future__ import annotations

import re
import tokenize
from typing import Callable

LINE_BREAK = re.compile(r"\r\n|\r|\n")
"""The line breaks of Python source: ``\\r\\n``, ``\\r`` and ``\\n``."""


def split_lines(text: str, keepends: bool = False) -> list[str]:
    """The lines of ``text``, broken only at ``\\r\\n``, ``\\r`` and ``\\n``.

    Like :meth:`str.splitlines`: a final line break does not start an empty
    line, and ``""`` gives ``[]``. With ``keepends`` each line keeps its
    break, so ``"".join(split_lines(t, True)) == t``.
    """
    out: list[str] = []
    pos = 0
    for m in LINE_BREAK.finditer(text):
        out.append(text[pos:m.end() if keepends else m.start()])
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return out


def line_starts(text: str) -> list[int]:
    """Offset of the first character of each 1-based line of ``text``.

    Index 0 is unused (``0``); index ``n`` is line ``n``'s start; one more
    entry follows the last line (the offset just past a final line break,
    or ``len(text)``), so the end of the last line is addressable. Columns
    are counted in code points, as LibCST's positions are.
    """
    starts = [0, 0]
    starts.extend(m.end() for m in LINE_BREAK.finditer(text))
    if starts[-1] != len(text) or len(starts) == 2:
        starts.append(len(text))
    return starts


def normalize_newlines(text: str) -> str:
    """``text`` with every ``\\r\\n`` and ``\\r`` turned into ``\\n``.

    Line numbers and columns are unchanged, so positions found in the result
    hold for ``text`` too (``tokenize`` and ``io.StringIO`` split only at
    ``\\n``, as flake8's universal-newline reading does).
    """
    return text.replace("\r\n", "\n").replace("\r", "\n")


_BYTE_LINE = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def bytes_readline(data: bytes) -> Callable[[], bytes]:
    """A ``readline`` over ``data`` that ends lines where Python does.

    For :func:`tokenize.detect_encoding`: fed ``io.BytesIO(data).readline``
    it sees a file with ``\\r`` line endings as one line and misses its
    ``coding:`` cookie, which CPython honours.
    """
    lines = iter(m.group() for m in _BYTE_LINE.finditer(data))
    return lambda: next(lines, b"")


def decode_source(data: bytes) -> str:
    """Decode file bytes the way Python does (PEP 263 cookie, BOM, UTF-8).

    Raises:
        UnicodeDecodeError: the bytes are not valid in the declared encoding.
        SyntaxError: the encoding cookie names an unknown codec.
    """
    encoding, _ = tokenize.detect_encoding(bytes_readline(data))
    text = data.decode(encoding)
    if text.startswith("\ufeff"):
        text = text[1:]
    return text
