"""Which files to lint: explicit files as given, directories walked
recursively, skipping hidden entries, virtual environments, the excluded names
of the applicable ``[tool.torchgradlint]`` config (``exclude`` /
``extend-exclude``, default :data:`~torchgradlint.config.DEFAULT_EXCLUDE`) and
whatever ``.gitignore`` files (read with pathspec's git semantics) ignore.
Walked directories yield Python files and Jupyter notebooks (``.ipynb``).
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import pathspec

from .config import DEFAULT_EXCLUDE, Settings

PYTHON_SUFFIXES = (".py", ".pyi", ".ipynb")
# DEFAULT_EXCLUDE holds plain folder names and globs ("*.egg-info/"): matched
# by name with fnmatch, so a run over a tree without .gitignore files or
# configured patterns never imports pathspec (its import costs ~60 ms).
_DEFAULT_DIRS = tuple(p.rstrip("/") for p in DEFAULT_EXCLUDE if p.endswith("/"))
_DEFAULT_FILES = tuple(p for p in DEFAULT_EXCLUDE if not p.endswith("/"))


def _default_excluded(name: str, is_dir: bool) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in (_DEFAULT_DIRS if is_dir else _DEFAULT_FILES))


def _gitignore_spec(lines: Sequence[str]) -> "pathspec.PathSpec":
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines)


@dataclass
class Discovery:
    """Files to lint (in walk order), user errors about the given paths
    (a missing path) and warnings (a directory without Python files)."""

    files: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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
    return _gitignore_spec(lines)


def git_work_tree(start: Path) -> Optional[Path]:
    """The nearest folder at or above the absolute path ``start`` that holds
    ``.git``, or ``None`` outside a git work tree."""
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return None


def _ancestor_specs(directory: Path) -> list[tuple[Path, pathspec.PathSpec]]:
    """``.gitignore`` files from the enclosing git work tree's root down to
    ``directory``'s parent (those that apply to files below ``directory``).

    The user named ``directory`` explicitly, so it is linted even when an
    ancestor ``.gitignore`` ignores it (as ruff and ripgrep do); such a
    ``.gitignore`` is matched relative to ``directory`` instead, so its
    unanchored patterns (``*.pyc``, ``generated_*.py``) still apply below.
    """
    specs: list[tuple[Path, pathspec.PathSpec]] = []
    parent = directory.resolve().parent
    root = git_work_tree(parent)
    if root is None:
        return []
    chain = [parent, *parent.parents]
    for anc in reversed(chain[:chain.index(root) + 1]):
        spec = _load_spec(anc)
        if spec is not None:
            # A spec that ignores the named directory itself is re-rooted there:
            # the directory is linted, its unanchored patterns still apply below it.
            specs.append((directory if _ignored(directory, True, [(anc, spec)]) else anc, spec))
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


def _config_excludes(settings: Optional[Settings], path: Path, is_dir: bool) -> bool:
    """Whether the config that applies to ``path`` (or the default excludes) skips it."""
    cfg = settings.config_for(path.parent, is_dir=True) if settings is not None else None
    if cfg is not None:
        return cfg.excludes(path, is_dir)
    return _default_excluded(path.name, is_dir)


def _walk(root: Path, specs: list[tuple[Path, pathspec.PathSpec]],
          excluded: Optional[pathspec.PathSpec], suffixes: tuple[str, ...],
          settings: Optional[Settings] = None, warnings: Optional[list[str]] = None) -> Iterator[str]:
    """Files below ``root`` to lint. A folder that cannot be read or an entry
    that cannot be examined (a symlink loop, no permission) adds a warning to
    ``warnings`` and the walk goes on."""
    try:
        own = _load_spec(root)
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError as exc:
        _warn(warnings, root, exc)
        return
    here = specs + ([(root, own)] if own is not None else [])
    for entry in entries:
        p = Path(entry.path)
        if entry.name.startswith("."):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                if _is_venv(p) or _config_excludes(settings, p, True):
                    continue
                if _ignored(p, True, here) or (excluded is not None and excluded.match_file(p.as_posix() + "/")):
                    continue
                yield from _walk(p, here, excluded, suffixes, settings, warnings)
            elif entry.name.endswith(suffixes) and entry.is_file():
                if _config_excludes(settings, p, False):
                    continue
                if _ignored(p, False, here) or (excluded is not None and excluded.match_file(p.as_posix())):
                    continue
                yield entry.path
        except OSError as exc:
            _warn(warnings, p, exc)


def _warn(warnings: Optional[list[str]], path: Path, exc: OSError) -> None:
    if warnings is not None:
        warnings.append(f"{path}: skipped, {exc.strerror or exc}")


def discover(paths: Sequence[str], exclude: Sequence[str] = (),
             suffixes: tuple[str, ...] = PYTHON_SUFFIXES, *,
             settings: Optional[Settings] = None, force_exclude: bool = False) -> Discovery:
    """Expand ``paths`` into files to lint.

    Explicitly named files are always linted, whatever their suffix, unless
    ``force_exclude`` applies the excludes to them too (for pre-commit).
    ``exclude`` holds gitignore-style patterns matched against the walked
    paths; ``settings`` supplies each folder's config excludes (default
    excludes without it). A missing path is a user error; a directory that
    holds no Python file is a warning, and so is a folder or entry below a
    walked directory that cannot be read (a symlink loop, no permission).

    Raises:
        ConfigError: a ``pyproject.toml`` on the way is malformed.
    """
    out = Discovery()
    excluded = _gitignore_spec(exclude) if exclude else None
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            out.errors.append(f"{raw}: no such file or directory")
        elif p.is_dir():
            found = [os.path.normpath(f)
                     for f in _walk(p, _ancestor_specs(p), excluded, suffixes, settings, out.warnings)]
            if not found:
                out.warnings.append(f"{raw}: no Python files found in this directory")
            out.files.extend(found)
        else:
            if force_exclude and (
                (excluded is not None and excluded.match_file(p.as_posix()))
                or (settings is not None and (cfg := settings.config_for(p)) is not None
                    and cfg.excludes(p, False))
            ):
                continue
            out.files.append(raw)
    seen: set[str] = set()
    out.files = [f for f in out.files if not (f in seen or seen.add(f))]
    return out
