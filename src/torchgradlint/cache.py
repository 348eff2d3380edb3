"""Content-hash cache of per-file diagnostics (``.torchgradlint_cache``).

A file's entry is keyed by the SHA-256 of: the file's bytes, the name it is
reported under, the rule selection that applies to it (as selector text, see
:meth:`torchgradlint.config.Settings.selection_key`) and a fingerprint of
torchgradlint itself (version plus the size and mtime of every module of the
package, so an edited checkout never reads stale entries). An unchanged file
under unchanged settings is never parsed again.

Entries are small JSON files written atomically (a temporary file renamed
into place), so concurrent runs (pre-commit, editor, CI) are safe: a reader
sees a whole entry or none. A cache folder holds a ``CACHEDIR.TAG`` and a
``.gitignore`` so backup tools and git leave it alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from . import __version__
from .diagnostics import Diagnostic, Fix

DEFAULT_DIR = ".torchgradlint_cache"
ENV_DIR = "TORCHGRADLINT_CACHE_DIR"
_FORMAT = 1

_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by torchgradlint.\n"


def tool_fingerprint() -> str:
    """Version plus size and mtime (ns) of every module of the package."""
    root = Path(__file__).resolve().parent
    h = hashlib.sha256(f"{__version__}/{_FORMAT}".encode())
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                st = os.stat(os.path.join(dirpath, name))
                h.update(f"{os.path.relpath(os.path.join(dirpath, name), root)}:{st.st_size}:{st.st_mtime_ns};"
                         .encode())
    return h.hexdigest()[:16]


def _to_json(d: Diagnostic) -> dict:
    out = {"code": d.code, "message": d.message, "line": d.line, "col": d.col,
           "end_line": d.end_line, "end_col": d.end_col, "cell": d.cell}
    if d.fix is not None:
        out["fix"] = [list(d.fix.start), list(d.fix.end), d.fix.replacement, d.fix.safe]
    return out


def _from_json(path: str, obj: dict) -> Diagnostic:
    fix = None
    if obj.get("fix"):
        start, end, text, safe = obj["fix"]
        fix = Fix(tuple(start), tuple(end), text, safe)
    return Diagnostic(obj["code"], obj["message"], path, obj["line"], obj["col"], obj["end_line"],
                      obj["end_col"], fix, obj.get("cell"))


class Cache:
    """One run's view of a cache folder.

    Args:
        directory: the cache folder (created on first write).
        fingerprint: :func:`tool_fingerprint`, computed once per run.
    """

    def __init__(self, directory: "str | os.PathLike[str]", fingerprint: Optional[str] = None) -> None:
        self.directory = Path(directory)
        self.fingerprint = fingerprint or tool_fingerprint()
        self._ready = False

    @classmethod
    def default(cls) -> "Cache":
        """The cache in ``$TORCHGRADLINT_CACHE_DIR`` or ``./.torchgradlint_cache``."""
        return cls(os.environ.get(ENV_DIR) or DEFAULT_DIR)

    def key(self, data: bytes, display: str, selection: str) -> str:
        """The entry key of one file's bytes under one selection."""
        h = hashlib.sha256(self.fingerprint.encode())
        h.update(b"\0" + display.encode("utf-8", "surrogateescape") + b"\0" + selection.encode() + b"\0")
        h.update(data)
        return h.hexdigest()

    def _entry(self, key: str) -> Path:
        return self.directory / self.fingerprint / key[:2] / f"{key}.json"

    def get(self, key: str, display: str) -> Optional[tuple[list[Diagnostic], bool]]:
        """Cached ``(diagnostics, parsed)`` for ``key``, or ``None`` on a miss
        (an unreadable or corrupt entry is a miss)."""
        try:
            with open(self._entry(key), encoding="utf-8") as fh:
                obj = json.load(fh)
            return [_from_json(display, d) for d in obj["diagnostics"]], bool(obj["parsed"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def put(self, key: str, diagnostics: Sequence[Diagnostic], parsed: bool) -> None:
        """Store an entry atomically; failures to write are ignored (the
        cache is an optimisation, never a reason to fail a run)."""
        target = self._entry(key)
        try:
            self._prepare()
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"parsed": parsed, "diagnostics": [_to_json(d) for d in diagnostics]}, fh)
            os.replace(tmp, target)
        except OSError:
            try:
                os.unlink(tmp)  # type: ignore[possibly-undefined]
            except (OSError, UnboundLocalError):
                pass

    def _prepare(self) -> None:
        if self._ready:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        for name, text in (("CACHEDIR.TAG", _TAG), (".gitignore", "# created by torchgradlint\n*\n")):
            p = self.directory / name
            if not p.exists():
                p.write_text(text, encoding="utf-8")
        self._ready = True
