"""``[tool.torchgradlint]`` in ``pyproject.toml``: loading, validation, lookup.

Keys (all optional, ruff's names and meanings)::

    [tool.torchgradlint]
    select = ["TGL0"]              # replaces the default rule set
    extend-select = ["TGL901"]     # adds to it
    ignore = ["TGL101"]            # removes (wins over select/extend-select)
    exclude = ["legacy/"]          # replaces the default excluded names
    extend-exclude = ["gen/*.py"]  # adds to the excluded paths
    max-file-size = 5242880        # bytes; a larger file is one TGL000, not parsed (0: no limit)
    file-timeout = 20              # seconds per file; a slower lint is stopped, one TGL000 (0: no limit)
    project-index = true           # resolve classes and decorators imported from the project's other files
    [tool.torchgradlint.per-file-ignores]
    "tests/**" = ["TGL1"]          # glob (relative to the pyproject.toml's folder) -> selectors

Each linted file gets the settings of the nearest ``pyproject.toml`` that holds
a ``[tool.torchgradlint]`` table, found by walking up from the file's folder;
files under different projects can get different settings. Lookups are cached
per folder, so a run reads each ``pyproject.toml`` once.

Selectors are codes (``TGL001``), code prefixes (``TGL0``), rule names
(``missing-zero-grad``) or ``ALL``. Glob patterns use gitignore syntax
(pathspec): a pattern without ``/`` matches a name at any depth.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from .limits import DEFAULT_BUDGET, Budget
from .registry import RuleLayer, SelectionError, check_selectors, resolve_codes

TABLE = "tool.torchgradlint"


def _tomllib():
    """tomllib (3.11+) or tomli, imported when a pyproject.toml is read."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on 3.9/3.10 only
        import tomli as tomllib
    return tomllib

# Folder and file names skipped while walking directories unless the config's
# ``exclude`` replaces this list. Hidden entries (".*") are always skipped.
DEFAULT_EXCLUDE = (
    "__pycache__/", "node_modules/", "site-packages/", "venv/", "env/", "virtualenv/",
    "__pypackages__/", "build/", "dist/", "_build/", "buck-out/", "*.egg-info/",
)

_SELECTORS = {"type": "array", "items": {"type": "string"}}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "select": _SELECTORS,
        "extend-select": _SELECTORS,
        "ignore": _SELECTORS,
        "exclude": _SELECTORS,
        "extend-exclude": _SELECTORS,
        "per-file-ignores": {"type": "object", "additionalProperties": _SELECTORS},
        "max-file-size": {"type": "integer", "minimum": 0},
        "file-timeout": {"type": "number", "minimum": 0},
        "project-index": {"type": "boolean"},
    },
}
"""JSON schema of the ``[tool.torchgradlint]`` table."""


class ConfigError(Exception):
    """A ``pyproject.toml`` that cannot be used: bad TOML, an unknown key, a
    value of the wrong type or an unknown rule selector. The message names the
    file and the key."""


@dataclass
class Config:
    """The settings of one ``[tool.torchgradlint]`` table.

    Attributes:
        path: the ``pyproject.toml`` it came from.
        root: that file's folder; relative globs are matched from here.
        rules: its select / extend-select / ignore.
        per_file_ignores: ``(glob, selectors)`` pairs.
        exclude: replaces :data:`DEFAULT_EXCLUDE` when given.
        extend_exclude: added to the excluded patterns.
        max_file_size: bytes (``max-file-size``), ``None`` when not set.
        file_timeout: seconds (``file-timeout``), ``None`` when not set.
        project_index: ``project-index``, ``None`` when not set (on).
    """

    path: Path
    root: Path
    rules: RuleLayer = field(default_factory=RuleLayer)
    per_file_ignores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    exclude: Optional[tuple[str, ...]] = None
    extend_exclude: tuple[str, ...] = ()
    max_file_size: Optional[int] = None
    file_timeout: Optional[float] = None
    project_index: Optional[bool] = None

    def __post_init__(self) -> None:
        import pathspec

        self._pfi = [(pathspec.GitIgnoreSpec.from_lines([g]), codes) for g, codes in self.per_file_ignores]
        pats = list(DEFAULT_EXCLUDE if self.exclude is None else self.exclude) + list(self.extend_exclude)
        self._excluded = pathspec.GitIgnoreSpec.from_lines(pats)

    def _relative(self, path: Path) -> Optional[str]:
        try:
            return path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return None

    def ignored_selectors(self, path: Path) -> list[str]:
        """Selectors that ``per-file-ignores`` switches off for ``path``."""
        rel = self._relative(path)
        if rel is None:
            return []
        return [c for spec, codes in self._pfi if spec.match_file(rel) for c in codes]

    def excludes(self, path: Path, is_dir: bool = False) -> bool:
        """Whether ``exclude``/``extend-exclude`` (or the default excludes) skip ``path``."""
        rel = self._relative(path)
        if rel is None or rel == ".":
            return False
        return self._excluded.match_file(rel + ("/" if is_dir else ""))


_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def _format_key(path: Iterable[Any]) -> str:
    """``tool.torchgradlint.per-file-ignores."tests/*"[0]``: TOML dotted key, list index in brackets."""
    key = TABLE
    for part in path:
        if isinstance(part, int):
            key += f"[{part}]"
        else:
            key += f".{part}" if _BARE_KEY.match(str(part)) else "." + json.dumps(str(part))
    return key


def _validate(table: Any, source: Path) -> None:
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema is a dependency
        jsonschema = None
    if jsonschema is not None:
        validator = jsonschema.Draft202012Validator(SCHEMA)
        errors = sorted(validator.iter_errors(table), key=lambda e: list(e.absolute_path))
        if errors:
            err = errors[0]
            where = list(err.absolute_path)
            if err.validator == "additionalProperties" and not where:
                extra = sorted(set(err.instance) - set(SCHEMA["properties"]))
                raise ConfigError(f"{source}: unknown key {_format_key([extra[0]])!r}; known keys: "
                                  + ", ".join(sorted(SCHEMA["properties"])))
            expected = {"array": "a list of strings", "string": "a string", "object": "a table",
                        "integer": "an integer", "number": "a number"}.get(
                str(err.validator_value), str(err.validator_value))
            if err.validator == "type":
                raise ConfigError(f"{source}: {_format_key(where)} must be {expected}, "
                                  f"not {type(err.instance).__name__} {err.instance!r}")
            raise ConfigError(f"{source}: {_format_key(where)}: {err.message}")
        return
    if not isinstance(table, dict):  # pragma: no cover
        raise ConfigError(f"{source}: {TABLE} must be a table")


def _check_selectors(selectors: Sequence[str], source: Path, key: list[Any]) -> None:
    for i, sel in enumerate(selectors):
        try:
            check_selectors([sel])
        except SelectionError as exc:
            raise ConfigError(f"{source}: {_format_key([*key, i])}: {exc}") from None


def parse_config(data: dict[str, Any], source: Path) -> Config:
    """Validate a ``[tool.torchgradlint]`` table and build its :class:`Config`.

    Raises:
        ConfigError: unknown key, wrong type, or unknown rule selector.
    """
    _validate(data, source)
    for key in ("select", "extend-select", "ignore"):
        _check_selectors(data.get(key, []), source, [key])
    pfi = data.get("per-file-ignores", {})
    for glob, codes in pfi.items():
        _check_selectors(codes, source, ["per-file-ignores", glob])
    return Config(
        path=source,
        root=source.parent.resolve(),
        rules=RuleLayer(
            select=tuple(data["select"]) if "select" in data else None,
            extend_select=tuple(data.get("extend-select", ())),
            ignore=tuple(data.get("ignore", ())),
        ),
        per_file_ignores=tuple((g, tuple(c)) for g, c in pfi.items()),
        exclude=tuple(data["exclude"]) if "exclude" in data else None,
        extend_exclude=tuple(data.get("extend-exclude", ())),
        max_file_size=data.get("max-file-size"),
        file_timeout=data.get("file-timeout"),
        project_index=data.get("project-index"),
    )


@lru_cache(maxsize=None)
def load_pyproject(path: str) -> Optional[Config]:
    """The :class:`Config` of one ``pyproject.toml``, or ``None`` when it has
    no ``[tool.torchgradlint]`` table. Cached per file.

    Raises:
        ConfigError: the file is not valid TOML or the table is malformed.
    """
    source = Path(path)
    try:
        with open(source, "rb") as fh:
            doc = _tomllib().load(fh)
    except _tomllib().TOMLDecodeError as exc:
        raise ConfigError(f"{source}: invalid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot be read: {exc.strerror or exc}") from None
    tool = doc.get("tool")
    if not isinstance(tool, dict) or "torchgradlint" not in tool:
        return None
    if not isinstance(tool["torchgradlint"], dict):
        raise ConfigError(f"{source}: {TABLE} must be a table")
    return parse_config(tool["torchgradlint"], source)


@lru_cache(maxsize=None)
def _find_for_dir(directory: str) -> Optional[Config]:
    d = Path(directory)
    candidate = d / "pyproject.toml"
    if candidate.is_file():
        cfg = load_pyproject(str(candidate))
        if cfg is not None:
            return cfg
    if d.parent == d:
        return None
    return _find_for_dir(str(d.parent))


def find_config(path: "str | os.PathLike[str]", *, is_dir: bool = False) -> Optional[Config]:
    """The config that applies to ``path``: the nearest ``pyproject.toml``
    with a ``[tool.torchgradlint]`` table in its folder or above. Cached per folder.

    Raises:
        ConfigError: a ``pyproject.toml`` on the way up is malformed.
    """
    text = os.fspath(path)
    directory = text if is_dir else (os.path.dirname(text) or ".")
    found = _DIR_MEMO.get(directory, _MISSING)
    if found is _MISSING:
        found = _DIR_MEMO[directory] = _find_for_dir(os.path.abspath(directory))
    return found  # type: ignore[return-value]


_MISSING = object()
_DIR_MEMO: dict[str, object] = {}  # the folder as given -> its config (or None)


def clear_cache() -> None:
    """Forget every loaded config (for long-lived processes and tests)."""
    load_pyproject.cache_clear()
    _find_for_dir.cache_clear()
    _DIR_MEMO.clear()


class Settings:
    """Per-file rule sets for one run: config files found per folder, then the
    command line's layer on top. ``isolated`` ignores every config file."""

    def __init__(self, cli: RuleLayer = RuleLayer(), *, isolated: bool = False,
                 max_file_size: Optional[int] = None, file_timeout: Optional[float] = None,
                 project_index: bool = True) -> None:
        self.cli = cli
        self.project_index = project_index  # False: the command line's --no-project-index
        self.isolated = isolated
        self.max_file_size = max_file_size  # the command line's, over the config's
        self.file_timeout = file_timeout
        self._cache: dict[tuple[Optional[str], tuple[str, ...]], tuple[str, ...]] = {}

    def config_for(self, path: "str | os.PathLike[str]", *, is_dir: bool = False) -> Optional[Config]:
        """The config of ``path`` (``None`` when isolated or none found).

        Raises:
            ConfigError: a malformed ``pyproject.toml``.
        """
        return None if self.isolated else find_config(path, is_dir=is_dir)

    def selection_key(self, path: "str | os.PathLike[str]") -> str:
        """A text that determines which rules apply to ``path`` without
        resolving them (no rule module is imported): the config file's rule
        layer, the command line's layer and the file's per-file-ignores.

        Raises:
            ConfigError: a malformed ``pyproject.toml``.
        """
        cfg = self.config_for(path)
        pfi = tuple(cfg.ignored_selectors(Path(path))) if cfg is not None else ()
        layers = ([cfg.rules] if cfg is not None else []) + [self.cli]
        return repr(([(l.select, l.extend_select, l.ignore) for l in layers], pfi))

    def codes_for(self, path: "str | os.PathLike[str]") -> tuple[str, ...]:
        """Codes of the rules enabled for the file ``path``.

        Raises:
            ConfigError: a malformed ``pyproject.toml``.
            SelectionError: a command-line selector names no rule.
        """
        cfg = self.config_for(path)
        pfi = tuple(cfg.ignored_selectors(Path(path))) if cfg is not None else ()
        key = (str(cfg.path) if cfg is not None else None, pfi)
        codes = self._cache.get(key)
        if codes is None:
            layers = ([cfg.rules] if cfg is not None else []) + [self.cli]
            codes = resolve_codes(layers, pfi)
            self._cache[key] = codes
        return codes

    def uses_project_index(self, path: "str | os.PathLike[str]") -> bool:
        """Whether the file ``path`` is linted with its project index: unless
        the command line turned it off or its config says ``project-index =
        false``.

        Raises:
            ConfigError: a malformed ``pyproject.toml``.
        """
        if not self.project_index:
            return False
        cfg = self.config_for(path)
        return cfg is None or cfg.project_index is not False

    def budget_for(self, path: "str | os.PathLike[str]") -> Budget:
        """The :class:`~torchgradlint.limits.Budget` of the file ``path``: the
        command line's values, else its config's, else the defaults.

        Raises:
            ConfigError: a malformed ``pyproject.toml``.
        """
        cfg = self.config_for(path)

        def pick(cli: Any, key: str, default: Any) -> Any:
            if cli is not None:
                return cli
            value = getattr(cfg, key, None) if cfg is not None else None
            return default if value is None else value

        return Budget(pick(self.max_file_size, "max_file_size", DEFAULT_BUDGET.max_file_size),
                      float(pick(self.file_timeout, "file_timeout", DEFAULT_BUDGET.file_timeout)))
