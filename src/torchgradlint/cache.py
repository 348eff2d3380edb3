"""Content-hash cache of per-file diagnostics (``.torchgradlint_cache``).

One run reads one index file and writes it at most once, as ruff does with
its per-project cache: a re-run over 1,000 unchanged files costs one JSON load
instead of 1,000 file opens.

The index maps a *slot* (the name a file is reported under plus the rule
selection that applies to it, see
:meth:`torchgradlint.config.Settings.selection_key`) to the SHA-256 of the
file's bytes and the diagnostics found in them. A lookup hits only when the
digest of the bytes read now matches, so any edit misses. The index lives in
a folder named by a fingerprint of torchgradlint itself (version plus the size
and mtime of every module of the package), so a new version or an edited
checkout never reads stale results.

Concurrent runs (pre-commit, editor, CI) are safe: the index is replaced
atomically (a temporary file renamed into place), so a reader sees a whole
index or none, and a writer merges its new entries into the index on disk
just before replacing it. Two runs racing at that moment can lose each
other's *new* entries (a later cache miss), never return a wrong result.
Entries not used for :data:`MAX_AGE_DAYS` days are dropped when the index is
next written; so are the folders of other fingerprints left unused as long.
A cache folder holds a ``CACHEDIR.TAG`` and a ``.gitignore`` so backup tools
and git leave it alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import __version__
from .diagnostics import Diagnostic, Fix

DEFAULT_DIR = ".torchgradlint_cache"
ENV_DIR = "TORCHGRADLINT_CACHE_DIR"
INDEX = "index.json"
MAX_AGE_DAYS = 30
_FORMAT = 3
_FINGERPRINT = re.compile(r"[0-9a-f]{16}")

_TAG = "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by torchgradlint.\n"

#: ``(slot, digest)``: where a file's entry lives and what its bytes hash to.
EntryKey = tuple[str, str]


def tool_fingerprint() -> str:
    """Version plus size and mtime (ns) of every module of the package: 16 hex digits."""
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


def read_json(path: Path) -> dict:
    """The JSON object in ``path``; ``{}`` when it is missing, unreadable or
    not an object."""
    try:
        with open(path, encoding="utf-8") as fh:
            obj = json.load(fh)
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _today() -> int:
    return int(time.time() // 86400)


def _to_row(d: Diagnostic) -> list:
    fix = None if d.fix is None else [list(d.fix.start), list(d.fix.end), d.fix.replacement, d.fix.safe]
    return [d.code, d.message, d.line, d.col, d.end_line, d.end_col, d.cell, fix, d.detail]


def _from_row(path: str, row: list) -> Diagnostic:
    code, message, line, col, end_line, end_col, cell, fix, detail = row
    if fix is not None:
        start, end, text, safe = fix
        fix = Fix(tuple(start), tuple(end), text, safe)
    return Diagnostic(code, message, path, line, col, end_line, end_col, fix, cell, detail)


class Cache:
    """One run's view of a cache folder.

    Use :meth:`key`, :meth:`get` and :meth:`put` per file, then :meth:`save`
    once at the end of the run (nothing reaches the disk before).

    Args:
        directory: the cache folder (created on first write).
        fingerprint: :func:`tool_fingerprint`, computed once per run.
    """

    def __init__(self, directory: "str | os.PathLike[str]", fingerprint: Optional[str] = None) -> None:
        self.directory = Path(directory)
        self.fingerprint = fingerprint or tool_fingerprint()
        self._index: Optional[dict[str, list]] = None
        self._changed: dict[str, list] = {}
        self._today = _today()

    @classmethod
    def default(cls) -> "Cache":
        """The cache in ``$TORCHGRADLINT_CACHE_DIR`` or ``./.torchgradlint_cache``."""
        return cls(os.environ.get(ENV_DIR) or DEFAULT_DIR)

    @property
    def index_path(self) -> Path:
        """The index file of this fingerprint."""
        return self.directory / self.fingerprint / INDEX

    def key(self, data: bytes, display: str, selection: str) -> EntryKey:
        """The entry key of one file's bytes, reported as ``display``, under
        the rule selection text ``selection``."""
        slot = hashlib.sha256(display.encode("utf-8", "surrogateescape") + b"\0" + selection.encode()).hexdigest()
        return slot[:32], hashlib.sha256(self.fingerprint.encode() + b"\0" + data).hexdigest()

    def get(self, key: EntryKey, display: str,
            still_valid: Optional[Callable[[Sequence], bool]] = None) -> Optional[tuple[list[Diagnostic], bool]]:
        """Cached ``(diagnostics, parsed)`` for ``key``, or ``None`` on a
        miss (an unreadable or corrupt index is empty). An entry recorded
        with ``deps`` (other files whose facts the result rests on) hits only
        when ``still_valid(deps)`` says they are unchanged."""
        if self._index is None:
            self._index = self._read()
        slot, digest = key
        entry = self._index.get(slot)
        try:
            if entry is None or entry[0] != digest:
                return None
            deps = entry[4] if len(entry) > 4 else []
            if deps and (still_valid is None or not still_valid(deps)):
                return None
            found = [_from_row(display, row) for row in entry[3]], bool(entry[1])
        except (ValueError, TypeError, IndexError, KeyError):
            return None
        if entry[2] != self._today:
            self._changed[slot] = [entry[0], entry[1], self._today, *entry[3:]]
        return found

    def put(self, key: EntryKey, diagnostics: Sequence[Diagnostic], parsed: bool, deps: Sequence = ()) -> None:
        """Record one file's result, written by :meth:`save`. ``deps``: the
        other files its result rests on, as JSON-able items that
        :meth:`get`'s ``still_valid`` checks (the project index's
        ``[path, digest]`` pairs)."""
        slot, digest = key
        row = [digest, int(parsed), self._today, [_to_row(d) for d in diagnostics]]
        self._changed[slot] = row + [list(deps)] if deps else row

    def save(self) -> None:
        """Merge this run's entries into the index on disk and replace it
        atomically; drop entries unused for :data:`MAX_AGE_DAYS` days. Does
        nothing when the run changed nothing. Failures to write are ignored
        (the cache is an optimisation, never a reason to fail a run)."""
        if not self._changed:
            return
        index = self._read()  # what concurrent runs wrote since this run began
        index.update(self._changed)
        oldest = self._today - MAX_AGE_DAYS
        index = {slot: e for slot, e in index.items() if isinstance(e, list) and len(e) in (4, 5)
                 and isinstance(e[2], int) and e[2] >= oldest}
        self.write_json(self.index_path, {"format": _FORMAT, "entries": index})
        self._index, self._changed = index, {}

    def _read(self) -> dict[str, list]:
        obj = read_json(self.index_path)
        entries = obj.get("entries") if obj.get("format") == _FORMAT else {}
        return entries if isinstance(entries, dict) else {}

    def write_json(self, path: Path, obj: object) -> None:
        """Write ``obj`` as JSON to ``path`` (a file in this cache's
        fingerprint folder) atomically: a temporary file renamed into place.
        Failures to write are ignored."""
        tmp = None
        try:
            self._prepare()
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(obj, fh, separators=(",", ":"))
            os.replace(tmp, path)
            tmp = None
        except OSError:
            pass
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass

    def _prepare(self) -> None:
        self.index_path.parent.mkdir(parents=True, exist_ok=True)
        for name, text in (("CACHEDIR.TAG", _TAG), (".gitignore", "# created by torchgradlint\n*\n")):
            p = self.directory / name
            if not p.exists():
                p.write_text(text, encoding="utf-8")
        self._prune_other_fingerprints()

    def _prune_other_fingerprints(self) -> None:
        """Remove the folders of other tool fingerprints (older versions,
        earlier edits of a checkout) whose last write is over
        :data:`MAX_AGE_DAYS` days old."""
        cutoff = time.time() - MAX_AGE_DAYS * 86400
        try:
            with os.scandir(self.directory) as it:
                stale = [e.path for e in it if _FINGERPRINT.fullmatch(e.name) and e.name != self.fingerprint
                         and e.is_dir(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime < cutoff]
        except OSError:
            return
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
