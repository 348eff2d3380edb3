"""Which files to lint: explicit files as given, directories walked
recursively, skipping hidden folders, virtual environments, caches and
whatever ``.gitignore`` files (read with pathspec's git semantics) ignore.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pathspec

PYTHON_SUFFIXES = (".py", ".pyi")
SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "venv", "env", "virtualenv",
                       "__pypackages__", "build", "dist", "_build", "buck-out"})


@dataclass
class Discovery:
    """Files to lint (in walk order) and user errors about the given paths."""

    files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _is_venv(path: Path) -> bool:
    return (path / "pyvenv.cfg").is_file() or (path / "conda-meta").is_dir()


def _load_spec(directory: Path) -> Optional[pathspec.PathSpec]:
    gi = directory / ".gitignore"
    if not gi.is_file():
        return None
    try:
        lines = gi.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    return pathspec.GitIgnoreSpec.from_lines(lines)


def _ancestor_specs(directory: Path) -> list[tuple[Path, pathspec.PathSpec]]:
    """``.gitignore`` files from the enclosing git work tree's root down to
    ``directory``'s parent (those that apply to files below ``directory``)."""
    specs: list[tuple[Path, pathspec.PathSpec]] = []
    d = directory.resolve().parent
    chain = []
    while True:
        chain.append(d)
        if (d / ".git").exists() or d.parent == d:
            break
        d = d.parent
    if not (chain[-1] / ".git").exists():
        return []
    for anc in reversed(chain):
        spec = _load_spec(anc)
        if spec is not None:
            specs.append((anc, spec))
    return specs


def _ignored(path: Path, is_dir: bool, specs: Sequence[tuple[Path, pathspec.PathSpec]]) -> bool:
    for base, spec in specs:
        try:
            rel = path.resolve().relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
        if spec.match_file(rel + ("/" if is_dir else "")):
            return True
    return False


def _walk(root: Path, specs: list[tuple[Path, pathspec.PathSpec]],
          excluded: Optional[pathspec.PathSpec], suffixes: tuple[str, ...]) -> Iterator[str]:
    own = _load_spec(root)
    here = specs + ([(root, own)] if own is not None else [])
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return
    for entry in entries:
        p = Path(entry.path)
        if entry.name.startswith("."):
            continue
        if entry.is_dir(follow_symlinks=False):
            if entry.name in SKIP_DIRS or entry.name.endswith(".egg-info") or _is_venv(p):
                continue
            if _ignored(p, True, here) or (excluded is not None and excluded.match_file(p.as_posix() + "/")):
                continue
            yield from _walk(p, here, excluded, suffixes)
        elif entry.is_file() and entry.name.endswith(suffixes):
            if _ignored(p, False, here) or (excluded is not None and excluded.match_file(p.as_posix())):
                continue
            yield entry.path


def discover(paths: Sequence[str], exclude: Sequence[str] = (),
             suffixes: tuple[str, ...] = PYTHON_SUFFIXES) -> Discovery:
    """Expand ``paths`` into files to lint.

    Explicitly named files are always linted, whatever their suffix.
    ``exclude`` holds gitignore-style patterns matched against the walked
    paths. A missing path is a user error; so is a directory that holds no
    Python file.
    """
    out = Discovery()
    excluded = pathspec.GitIgnoreSpec.from_lines(exclude) if exclude else None
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            out.errors.append(f"{raw}: no such file or directory")
        elif p.is_dir():
            found = list(_walk(p, _ancestor_specs(p), excluded, suffixes))
            if not found:
                out.errors.append(f"{raw}: no Python files found in this directory")
            out.files.extend(found)
        else:
            out.files.append(raw)
    seen: set[str] = set()
    out.files = [f for f in out.files if not (f in seen or seen.add(f))]
    return out
