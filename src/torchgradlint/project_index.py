"""The project index: facts that live in another file of the same project.

A training script builds ``Net`` from ``model.py``, decorates ``run()`` with
``@smart_inference_mode()`` from ``utils/torch_utils.py``: linted alone, the
script cannot tell whether ``Net`` has dropout or batch norm, nor what the
decorator does to grad mode. The index answers both for names the file
imports from its own project (``from .models import Net``, ``from model import
Net``, ``from pkg.sub import Net``, ``import utils`` then ``utils.Net``):

- a *project* is the nearest folder above the linted file that holds a
  ``pyproject.toml``, ``setup.py``, ``setup.cfg`` or ``.git``, else the
  common folder of the linted paths;
- a name is resolved as Python would on ``sys.path``: a relative import from
  the importing file's package, an absolute one from the importing file's
  folder (a script's ``sys.path[0]``), from above its top package, from the
  project root and from ``<root>/src``; re-exports (``from .model import
  Net`` in a package's ``__init__.py``) are followed. A name that resolves to
  nothing stays unknown, exactly as without the index;
- each file reached is *summarised* once: for every module-level class and
  function, whether its own source may make a forward depend on training
  mode (:func:`torchgradlint.analysis.modes.code_sensitive`, the same test a
  class of the linted file gets) and the names it takes from elsewhere that
  decide it (its bases, imported layers), and its effect as a decorator
  (``"disabled"`` when it wraps ``torch.inference_mode``/``torch.no_grad``,
  ``"unknown"`` when it switches grad mode on a flag, else none: it just calls
  the function). A verdict follows the names across files.

Files are summarised lazily, only when a linted file asks about a name they
define, so a run pays for the files its scripts import, not for the whole
project; and in two steps: first an *outline* from Python's ``ast``
(:func:`outline`: the names a file defines and imports, and the decorator
effects its text decides), then, only for a question the outline cannot
answer (a verdict, a definition that spells a grad-mode API), the full
summary on LibCST and the analysis (on the 29 packages of ``realcode/``, 4 of
the 56 files the index reached needed it). Summaries are kept on disk next to the content-hash cache
(:mod:`torchgradlint.cache`: same folder, fingerprint and atomic write), keyed
by the file's SHA-256; a file whose size and modification time are unchanged
is not even re-read. A file over :data:`MAX_FILE_BYTES`, or past the
:data:`MAX_FILES` summaries of one process, is not summarised: its names stay
unknown.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover - LibCST is imported only when a file is summarised or linted
    import libcst as cst

    from .analysis.model import GradMode
    from .prefilter import FileFacts

MARKERS = ("pyproject.toml", "setup.py", "setup.cfg", ".git")
"""Files or folders whose presence makes a folder a project root."""

MAX_FILES = 20000
"""Summaries one process computes at most (no real repository in the
measured corpora reaches it: transformers has 4,700 Python files)."""

MAX_FILE_BYTES = 2 * 1024 * 1024
"""A larger file is not summarised (the largest in the corpora is 1.0 MB)."""

_FORMAT = 8  # 2: entries may hold an outline (``"partial"``); 3: symbols say what a forward returns;
# 4: symbols say which kinds of mode-dependent layer their own code may hold;
# 5: a module imported whole (``import modules``) is a dependency by the attributes read on it;
# 6: a class is judged by the code its forward may reach (:func:`~.analysis.modes.class_code`)
# 7: symbols say whether a class's ``update`` adds its argument into a running sum (a meter)
# 8: a class's verdict judges each same-file class it builds by the literal arguments it gives
# ``@name`` / ``@a.b(...)`` at the start of a line: a decorator, by text.
_DECORATOR = re.compile(r"^[ \t]*@[ \t]*([A-Za-z_][\w.]*)", re.MULTILINE)
# Decorators that cannot come from the project.
_PLAIN_DECORATORS = frozenset({"torch", "staticmethod", "classmethod", "property", "functools", "abc",
                               "dataclass", "dataclasses", "pytest", "typing", "overload", "override"})
_MAX_HOPS = 6  # re-exports and base classes followed across files
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\s*\.\s*[A-Za-z_][A-Za-z0-9_]*)*")
_DISABLING = frozenset({"torch.no_grad", "torch.inference_mode"})
_SWITCHING = frozenset({"torch.enable_grad", "torch.set_grad_enabled"})


def find_root(path: "str | os.PathLike[str]", fallback: Optional[Path] = None,
              memo: Optional[dict[str, bool]] = None) -> Optional[Path]:
    """The project root of the file ``path``: the nearest folder at or above
    its folder with one of :data:`MARKERS`, else ``fallback`` when it is an
    ancestor of the file, else ``None``. ``memo``: folder -> has a marker,
    shared by the lookups of one run."""
    memo = {} if memo is None else memo
    start = Path(os.path.abspath(path)).parent
    for d in (start, *start.parents):
        key = str(d)
        found = memo.get(key)
        if found is None:
            found = memo[key] = any(os.path.exists(os.path.join(key, m)) for m in MARKERS)
        if found:
            return d
    if fallback is not None and (fallback == start or fallback in start.parents):
        return fallback
    return None


def common_folder(paths: Sequence[str]) -> Optional[Path]:
    """The deepest folder holding every path of ``paths`` (files or folders)."""
    if not paths:
        return None
    folders = [os.path.abspath(p) if os.path.isdir(p) else os.path.dirname(os.path.abspath(p)) for p in paths]
    try:
        return Path(os.path.commonpath(folders))
    except ValueError:  # different drives
        return None


@dataclass(frozen=True)
class Decorator:
    """What a project definition does to grad mode when used as a decorator:
    ``mode`` is ``GradMode.DISABLED``, ``GradMode.UNKNOWN`` or ``None`` (no change)."""

    mode: Optional[GradMode]


# -- summaries ------------------------------------------------------------------------
def _top_level(body: Iterable[cst.CSTNode]) -> Iterable[cst.CSTNode]:
    """Module-level statements, looking into ``if``/``try`` blocks
    (``if TYPE_CHECKING:``, ``try: import x except ImportError:``)."""
    import libcst as cst

    for stmt in body:
        if isinstance(stmt, cst.SimpleStatementLine):
            yield from stmt.body
        elif isinstance(stmt, (cst.If, cst.Try)):
            yield stmt
            blocks = [stmt.body]
            if isinstance(stmt, cst.If) and stmt.orelse is not None:
                blocks.append(stmt.orelse.body if isinstance(stmt.orelse, cst.Else) else cst.IndentedBlock([stmt.orelse]))
            if isinstance(stmt, cst.Try):
                blocks += [h.body for h in stmt.handlers]
            for block in blocks:
                if isinstance(block, cst.IndentedBlock):
                    yield from _top_level(block.body)
        else:
            yield stmt


def relative_imports(module: cst.Module) -> dict[str, str]:
    """Names a module binds by relative imports at module level, each with
    its import spec: ``from ..models import Net as N`` -> ``{"N":
    "..models.Net"}``, ``from . import utils`` -> ``{"utils": ".utils"}``."""
    import libcst as cst

    out: dict[str, str] = {}
    for node in _top_level(module.body):
        if not isinstance(node, cst.ImportFrom) or not node.relative or isinstance(node.names, cst.ImportStar):
            continue
        base = "." * len(node.relative) + (_dotted(node.module) or "" if node.module is not None else "")
        for alias in node.names:
            name = _dotted(alias.name)
            if not name:
                continue
            local = alias.asname.name.value if alias.asname is not None and isinstance(alias.asname.name, cst.Name) \
                else name
            out[local] = base + ("" if base.endswith(".") else ".") + name
    return out


def _dotted(node: Optional[cst.CSTNode]) -> Optional[str]:
    from .analysis.names import dotted_name

    return dotted_name(node)


class _Recorder:
    """The ``project`` of a file being summarised: records, as import specs,
    the names its definitions take from elsewhere, and answers "mode-free"
    for each so that the summary holds the definition's own verdict."""

    def __init__(self, relative: dict[str, str]) -> None:
        self.relative = relative
        self.deps: set[str] = set()

    def imports_relatively(self, name: str) -> bool:
        return name in self.relative

    def sensitive(self, text: str) -> Optional[bool]:
        if text:
            self.deps.add(_spec(text, self.relative))
        return False

    def free_of(self, text: str, kind: str) -> bool:
        return self.sensitive(text) is False

    def decorator(self, text: str) -> None:
        return None

    def forward_kind(self, text: str, index: Optional[int] = None) -> None:
        return None  # a summary holds what the file's own code shows

    def meter(self, text: str) -> None:
        return None


def _spec(text: str, relative: dict[str, str]) -> str:
    """``text`` (a qualified name, or one bound by a relative import) as an import spec."""
    head, sep, rest = text.partition(".")
    if head in relative:
        return relative[head] + (sep + rest if sep else "")
    return text


def _grad_effect(model: object, code: str) -> Optional[str]:
    """``"disabled"`` when ``code`` names ``torch.inference_mode``/``no_grad``
    (a wrapper that runs the function under it), ``"unknown"`` when it names
    ``torch.enable_grad``/``set_grad_enabled``, else ``None``."""
    qualify = model.names.qualify  # type: ignore[attr-defined]
    effect = None
    for m in _DOTTED.finditer(code):
        qn = qualify(re.sub(r"\s+", "", m.group()))
        if qn in _DISABLING:
            return "disabled"
        if qn in _SWITCHING:
            effect = "unknown"
    return effect


def summarise(source: str, path: str) -> Optional[dict]:
    """The summary of one file's text (JSON-able), or ``None`` when it does
    not parse.

    Returns:
        ``{"symbols": {name: [sensitive, deps, effect, outputs, kinds, meter]}, "imports": {name: spec}}``:
        for each module-level class and function, whether its own source may
        make a forward depend on training mode, the import specs it takes
        from elsewhere whose verdicts decide it, its decorator effect,
        for a module class whose ``forward`` returns probabilities what it
        returns (:func:`torchgradlint.analysis.probabilities.forward_kinds`:
        ``[kind, [kind of each tuple element]]``, else ``None``), and which
        kinds of mode-dependent layer its own source may hold
        (:data:`~torchgradlint.analysis.modes.LAYER_KINDS`: ``"dropout"``,
        ``"statistics"``; empty when it is mode-free), and for a class
        whether its ``update`` adds its argument into a running sum (a
        meter: :func:`~torchgradlint.analysis.meters.update_accumulates`;
        ``None`` for a function);
        ``imports``: every module-level name the file imports (for
        re-exports), as import specs.
    """
    import libcst as cst

    from .analysis import build_model
    from .analysis.modes import class_sensitive, code_sensitive, layer_kinds
    from .analysis.probabilities import forward_kinds
    from .engine import parse_module

    try:
        module = parse_module(source)
    except (cst.ParserSyntaxError, RecursionError):
        return None
    model = build_model(module, source, path)
    relative = relative_imports(module)
    meters = (outline(source) or {"symbols": {}})["symbols"]  # the same ``ast`` test as the outline's
    symbols: dict[str, list] = {}
    for node in _top_level(module.body):
        if not isinstance(node, (cst.ClassDef, cst.FunctionDef)):
            continue
        name = node.name.value
        recorder = _Recorder(relative)
        model.project = recorder
        code = module.code_for_node(node)
        if isinstance(node, cst.ClassDef):
            local = class_sensitive(model, name)
        else:
            local = code_sensitive(model, code, name, {name})
        outputs = None
        if isinstance(node, cst.ClassDef):  # a class decorates by what it derives from (a ContextDecorator)
            effect = _grad_effect(model, " ".join(_dotted(arg.value) or "" for arg in node.bases))
            outputs = forward_kinds(model, name)
        else:
            effect = _grad_effect(model, code)
        kinds = layer_kinds(model, code, name) if local else []
        symbols[name] = [bool(local), sorted(recorder.deps), effect, outputs, kinds,
                         meters[name][5] if name in meters else None]
    model.project = None
    imports = {local: spec for local, spec in model.names.aliases.items() if "." in spec}
    imports.update(relative)
    return {"symbols": symbols, "imports": imports}


# Words without which no code can name a grad-mode API (:data:`_DISABLING`, :data:`_SWITCHING`, and every
# spelling ``names.CANONICAL`` maps to them, keep the last name).
_GRAD_WORDS = re.compile(r"no_grad|enable_grad|set_grad_enabled|inference_mode")
# Words without which no code of a file can make a probability (TGL303's first text group; a forward
# that returns one spells it in its own file: the summary does not follow other files).
_PROBABILITY_WORDS = re.compile(r"softmax|Softmax|sigmoid|Sigmoid|expit")
UNDECIDED = "?"
"""An outline's decorator effect that only the full summary can give."""


def outline(source: str) -> Optional[dict]:
    """The cheap part of a file's summary, from Python's ``ast`` (a fraction
    of a LibCST parse and analysis), or ``None`` when Python's parser rejects
    the text (the full :func:`summarise` then decides).

    Returns:
        :func:`summarise`'s shape, with ``"partial": True``: the same symbol
        names and ``imports`` (so names resolve without the full summary);
        each symbol is ``[None, None, effect, outputs, None, meter]``, its verdict unknown
        until the full summary is made, its decorator effect ``None`` when no
        grad-mode API's name can be spelled in the lines LibCST gives the
        definition (its leading comments, decorators, body and trailing
        comments all lie between the statements before and after it), else
        :data:`UNDECIDED`, a class's outputs ``None`` when the file
        spells no softmax or sigmoid, else :data:`UNDECIDED`, and ``meter``
        as in the full summary.
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    lines = source.splitlines()
    top = list(_module_level(tree.body, lines))
    defs = [n for n in top if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    symbols: dict[str, list] = {}
    probabilities = UNDECIDED if _PROBABILITY_WORDS.search(source) else None
    if defs and _GRAD_WORDS.search(source):
        statements = [n for n in ast.walk(tree) if isinstance(n, ast.stmt)]
        starts = sorted(_first_line(n) for n in statements)
        ends = sorted(n.end_lineno or n.lineno for n in statements)
        for node in defs:
            first, last = _first_line(node), node.end_lineno or node.lineno
            i = bisect.bisect_left(ends, first)  # the statements that end before the definition starts
            j = bisect.bisect_right(starts, last)  # the first statement after it
            text = "\n".join(lines[ends[i - 1] if i else 0: starts[j] - 1 if j < len(starts) else len(lines)])
            symbols[node.name] = [None, None, UNDECIDED if _GRAD_WORDS.search(text) else None]
    else:
        for node in defs:
            symbols[node.name] = [None, None, None]
    for node in defs:  # a name defined twice is the later definition, as in the full summary
        symbols[node.name] = symbols[node.name][:3] + [
            probabilities if isinstance(node, ast.ClassDef) else None, None, _meter(node)]
    return {"symbols": symbols, "imports": _ast_imports(tree, top), "partial": True}


def _meter(node: ast.stmt) -> Optional[bool]:
    """A symbol's last field: for a class, whether its ``update`` adds its
    argument into a running sum (:func:`~.analysis.meters.update_accumulates`);
    ``None`` for a function."""
    from .analysis.meters import update_accumulates  # here: a fully cached run imports no analysis module

    return update_accumulates(node) if isinstance(node, ast.ClassDef) else None


def _first_line(node: ast.stmt) -> int:
    decorators = getattr(node, "decorator_list", None)
    return min([node.lineno, *(d.lineno for d in decorators)]) if decorators else node.lineno


def _module_level(body: list, lines: list[str]) -> Iterable[ast.stmt]:
    """:func:`_top_level` for Python's ``ast``: module-level statements in
    source order, looking into the indented blocks (not one-line suites) of
    an ``if`` (its body, ``elif`` and ``else``) and a ``try`` (its body and
    handlers)."""
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            blocks = [stmt.body, stmt.orelse]
        elif isinstance(stmt, ast.Try):
            blocks = [stmt.body, *(h.body for h in stmt.handlers)]
        else:
            continue
        for block in blocks:
            if block and _indented(block[0], lines):
                yield from _module_level(block, lines)


def _indented(first: ast.stmt, lines: list[str]) -> bool:
    """Whether the block that starts with ``first`` is an indented block
    (``first`` starts its line), not a one-line suite (``if x: import y``)."""
    line = lines[first.lineno - 1].encode("utf-8", "surrogatepass")  # ``col_offset`` counts UTF-8 bytes
    return not line[: first.col_offset].strip()


def _ast_imports(tree: ast.Module, top: list[ast.stmt]) -> dict[str, str]:
    """:func:`summarise`'s ``imports`` from Python's ``ast`` (``top``: the
    module-level statements, :func:`_module_level`): the aliases
    ``names.ImportTable`` records for every import of the file, in source
    order, then the module-level ``name = torch.x`` aliases the analysis
    adds (``builder._assume_conventional_names``), those with a dotted spec;
    then the module-level relative imports (:func:`relative_imports`)."""
    from .analysis.torch_api import CANONICAL

    imports = sorted((n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))),
                     key=lambda n: (n.lineno, n.col_offset))
    aliases: dict[str, str] = {}
    for node in imports:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    aliases.setdefault(head, head)
        elif not node.level and node.module:
            for alias in node.names:
                if alias.name != "*":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for target, value in _module_assignments(tree.body):
        dotted = _ast_dotted(value)
        if not dotted:
            continue
        head, sep, rest = dotted.partition(".")
        base = aliases.get(head, head)
        full = f"{base}.{rest}" if sep else base
        qualified = CANONICAL.get(full, full)
        if qualified.split(".")[0] == "torch" and dotted != target:
            aliases[target] = qualified
    out = {local: spec for local, spec in aliases.items() if "." in spec}
    for node in top:
        if isinstance(node, ast.ImportFrom) and node.level:
            base = "." * node.level + (node.module or "")
            for alias in node.names:
                if alias.name != "*":
                    out[alias.asname or alias.name] = base + ("" if base.endswith(".") else ".") + alias.name
    return out


def _module_assignments(body: list) -> Iterable[tuple[str, ast.expr]]:
    """``(name, value)`` of each single-name assignment whose scope is the
    module (any block outside a function or class), in source order, as the
    analysis records them: ``a = v`` and each pair of ``a, b = v, w``."""
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            if len(stmt.targets) != 1:
                continue
            target, value = stmt.targets[0], stmt.value
            if isinstance(target, ast.Name):
                yield target.id, value
            elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                    and len(target.elts) == len(value.elts) \
                    and not any(isinstance(e, ast.Starred) for e in (*target.elts, *value.elts)) \
                    and all(isinstance(e, (ast.Name, ast.Attribute)) for e in target.elts):
                for t, v in zip(target.elts, value.elts):
                    if isinstance(t, ast.Name):
                        yield t.id, v
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _module_assignments(getattr(stmt, "body", None) or [])
            for handler in getattr(stmt, "handlers", None) or []:
                yield from _module_assignments(handler.body)
            for case in getattr(stmt, "cases", None) or []:
                yield from _module_assignments(case.body)
            yield from _module_assignments(getattr(stmt, "orelse", None) or [])
            yield from _module_assignments(getattr(stmt, "finalbody", None) or [])


def _ast_dotted(node: ast.expr) -> Optional[str]:
    """``a.b.c`` for a chain of ``Name``/``Attribute`` nodes, else ``None``."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _summary(data: bytes, path: str, full: bool) -> Optional[dict]:
    """The full summary (:func:`summarise`) or else the outline
    (:func:`outline`) of a file's bytes; ``None`` when they do not decode or
    parse. Where Python's parser cannot make the outline, the full summary
    decides."""
    from .lines import decode_source

    try:
        source = decode_source(data)
        made = None if full else outline(source)
        return made if made is not None else summarise(source, path)
    except (UnicodeDecodeError, SyntaxError, LookupError, RecursionError):
        return None


# -- the index -----------------------------------------------------------------------------
class ProjectIndex:
    """Summaries of one project's files, resolved on demand.

    Args:
        root: the project root (absolute).
        store: the JSON file that keeps summaries between runs (in the
            cache folder), or ``None`` to keep them in memory only.
        max_files: summaries this process computes at most.
        max_file_bytes: a larger file is not summarised.
    """

    def __init__(self, root: Path, store: Optional[Path] = None, *, max_files: int = MAX_FILES,
                 max_file_bytes: int = MAX_FILE_BYTES) -> None:
        self.root = root
        self.store = store
        self.max_files = max_files
        self.max_file_bytes = max_file_bytes
        self.entries: dict[str, list] = {}  # path relative to root -> [sha256, size, mtime_ns, summary]
        self.fresh: dict[str, list] = {}  # entries made or refreshed by this process, not yet saved
        self.summarised = 0  # files parsed and summarised by this process
        self._paths: dict[Path, Optional[Path]] = {}
        self._folders: dict[Path, list[Path]] = {}
        self._stats: dict[str, Optional[list]] = {}  # per run: rel -> entry validated against the disk
        if store is not None:
            from .cache import read_json

            obj = read_json(store)
            files = obj.get("files") if obj.get("format") == _FORMAT and obj.get("root") == str(root) else None
            if isinstance(files, dict):
                self.entries = {k: v for k, v in files.items() if isinstance(v, list) and len(v) == 4}

    def _rel(self, path: Path) -> Optional[str]:
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return None

    def entry(self, path: Path) -> Optional[list]:
        """The up-to-date entry of the file ``path`` (``[sha256, size,
        mtime_ns, summary or None]``), summarising it when it is new or
        changed; ``None`` when it cannot be read or is over the limits."""
        rel = self._rel(path)
        if rel is None:
            return None
        if rel in self._stats:
            return self._stats[rel]
        found = self._stats[rel] = self._load(path, rel)
        return found

    def _load(self, path: Path, rel: str) -> Optional[list]:
        try:
            st = os.stat(path)
        except OSError:
            return None
        old = self.entries.get(rel)
        if old is not None and old[1] == st.st_size and old[2] == st.st_mtime_ns:
            return old
        if st.st_size > self.max_file_bytes:
            return None
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            return None
        digest = hashlib.sha256(data).hexdigest()
        if old is not None and old[0] == digest:
            new = [digest, st.st_size, st.st_mtime_ns, old[3]]
        else:
            if self.summarised >= self.max_files:
                return None
            self.summarised += 1
            new = [digest, st.st_size, st.st_mtime_ns, _summary(data, str(path), full=False)]
        self.entries[rel] = self.fresh[rel] = new
        return new

    def full_entry(self, path: Path) -> Optional[list]:
        """:meth:`entry`, with the full summary (:func:`summarise`) in place
        of an outline (:func:`outline`): made on the first question only it
        answers (a verdict, an undecided decorator effect)."""
        entry = self.entry(path)
        if entry is None or not entry[3] or not entry[3].get("partial"):
            return entry
        rel = self._rel(path)
        try:
            with open(path, "rb") as fh:
                data = fh.read()
            st = os.stat(path)
        except OSError:
            return entry
        assert rel is not None  # entry() found it under the root
        new = [hashlib.sha256(data).hexdigest(), st.st_size, st.st_mtime_ns, _summary(data, str(path), full=True)]
        self.entries[rel] = self.fresh[rel] = self._stats[rel] = new
        return new

    def effect(self, path: Path, name: str) -> Optional[str]:
        """The decorator effect of the definition ``name`` of the file
        ``path`` (``"disabled"``, ``"unknown"`` or ``None``; see
        :func:`summarise`), from its outline when that decides it."""
        return self._symbol_field(path, name, 2)

    def outputs(self, path: Path, name: str) -> Optional[list]:
        """What the ``forward`` of the module class ``name`` of the file
        ``path`` returns when that is a probability (``[kind, [kind of each
        tuple element]]``; see :func:`summarise`), else ``None``; from its
        outline when the file spells no softmax or sigmoid."""
        return self._symbol_field(path, name, 3)

    def meter(self, path: Path, name: str) -> Optional[bool]:
        """Whether the class ``name`` of the file ``path`` is a running-average
        meter (its ``update`` adds its argument into a running sum), from its
        outline; ``None`` when the file has no such class."""
        return self._symbol_field(path, name, 5)  # type: ignore[return-value]

    def _symbol_field(self, path: Path, name: str, field: int) -> object:
        """Field ``field`` of the symbol ``name`` in the summary of ``path``:
        from its outline, or from the full summary when the outline leaves it
        :data:`UNDECIDED`; ``None`` when the file has no such symbol."""
        entry = self.entry(path)
        for _ in range(2):
            symbol = entry[3]["symbols"].get(name) if entry is not None and entry[3] else None
            value = symbol[field] if symbol is not None and field < len(symbol) else None
            if value != UNDECIDED:
                return value
            entry = self.full_entry(path)
        return None

    def digest(self, path: str) -> Optional[str]:
        """The SHA-256 of the file ``path`` as it is now, without reading it
        when its size and modification time match its entry's (nor parsing
        it when they do not); ``None`` when it cannot be read."""
        p = Path(path)
        rel = self._rel(p)
        if rel is None:
            return None
        known = self._stats.get(rel)
        if known is not None:
            return known[0]
        try:
            st = os.stat(p)
        except OSError:
            return None
        old = self.entries.get(rel)
        if old is not None and old[1] == st.st_size and old[2] == st.st_mtime_ns:
            return old[0]
        try:
            with open(p, "rb") as fh:
                return hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            return None

    def still_valid(self, deps: Sequence) -> bool:
        """Whether every ``[path, sha256]`` of ``deps`` still matches the disk."""
        try:
            return all(self.digest(p) == d for p, d in deps)
        except (TypeError, ValueError):
            return False

    def merge(self, entries: dict[str, list]) -> None:
        """Take entries a worker process computed (to be saved by :meth:`save`)."""
        for rel, e in entries.items():
            self.entries[rel] = self.fresh[rel] = e
            self._stats.pop(rel, None)

    def drain(self) -> dict[str, list]:
        """The entries made since the last call (a worker sends them to the parent)."""
        out, self.fresh = self.fresh, {}
        return out

    def save(self, cache: object) -> None:
        """Write the summaries to :attr:`store` through ``cache``
        (:class:`torchgradlint.cache.Cache`), when this run changed any."""
        if self.store is None or not self.fresh:
            return
        from .cache import read_json

        obj = read_json(self.store)  # what concurrent runs wrote since this one began
        files = obj.get("files") if obj.get("format") == _FORMAT and obj.get("root") == str(self.root) else None
        merged = dict(files) if isinstance(files, dict) else {}
        merged.update(self.entries)
        cache.write_json(self.store, {"format": _FORMAT, "root": str(self.root), "files": merged})  # type: ignore[attr-defined]
        self.fresh = {}

    # -- resolution ---------------------------------------------------------
    def _module_file(self, base: Path, parts: Sequence[str]) -> Optional[Path]:
        target = base.joinpath(*parts)
        key = target
        if key not in self._paths:
            found = None
            for candidate in (target.with_name(target.name + ".py") if parts else None, target / "__init__.py"):
                if candidate is not None and candidate.is_file():
                    found = candidate
                    break
            self._paths[key] = found
        return self._paths[key]

    def _bases(self, importer: Path) -> list[Path]:
        """Folders an absolute import from ``importer`` is looked up in."""
        found = self._folders.get(importer.parent)
        if found is None:
            found = self._folders[importer.parent] = self._bases_uncached(importer)
        return found

    def _bases_uncached(self, importer: Path) -> list[Path]:
        out = [importer.parent]
        top = importer.parent
        while (top / "__init__.py").is_file() and top != self.root and self.root in top.parents:
            top = top.parent
        out += [top, self.root, self.root / "src"]
        seen: list[Path] = []
        for d in out:
            if d not in seen and (d == self.root or self.root in d.parents):
                seen.append(d)
        return seen

    def resolve(self, spec: str, importer: Path, hops: int = 0) -> Optional[tuple[Path, str]]:
        """The file and module-level name that the import spec ``spec``
        (``pkg.models.Net``, ``..models.Net``) means in the file
        ``importer``; ``None`` when it is not a definition of the project."""
        if not spec or hops > _MAX_HOPS:
            return None
        level = len(spec) - len(spec.lstrip("."))
        parts = spec[level:].split(".") if spec[level:] else []
        if not parts or parts[0] == "torch":
            return None
        if level:
            base = importer.parent
            for _ in range(level - 1):
                base = base.parent
            bases = [base]
        elif len(parts) < 2:
            return None  # a bare name: not imported from anywhere
        else:
            bases = self._bases(importer)
        found = self._first_module(bases, parts[:-1], importer)
        return self._symbol(found, parts[-1], hops) if found is not None else None

    def resolve_owner(self, spec: str, importer: Path) -> Optional[tuple[Path, str]]:
        """Like :meth:`resolve`, but a spec that reaches past a definition
        names what it reaches through: ``pkg.models.Net.from_config`` (a
        class's factory) resolves to ``pkg.models.Net``."""
        while spec:
            found = self.resolve(spec, importer)
            if found is not None:
                return found
            head, _, last = spec.rpartition(".")
            if not head or not head.strip(".") or not last:
                return None
            spec = head
        return None

    def _symbol(self, path: Path, name: str, hops: int) -> Optional[tuple[Path, str]]:
        entry = self.entry(path)
        summary = entry[3] if entry is not None else None
        if not summary:
            return None
        if name in summary["symbols"]:
            return path, name
        spec = summary["imports"].get(name)
        return self.resolve(spec, path, hops + 1) if spec else None

    def verdict(self, path: Path, name: str, used: dict[str, str], seen: Optional[set] = None,
                hops: int = 0, kind: Optional[str] = None) -> bool:
        """Whether the definition ``name`` of the file ``path`` may make a
        forward depend on training mode (with ``kind``: through that kind of
        layer, ``"dropout"`` or ``"statistics"``), following the names it
        takes from other project files (an unresolvable one counts as may).
        ``used`` collects ``path -> sha256`` of every file consulted."""
        seen = set() if seen is None else seen
        if (path, name) in seen:
            return False
        seen.add((path, name))
        entry = self.full_entry(path)
        if entry is None or not entry[3] or name not in entry[3]["symbols"]:
            return True
        used[str(path)] = entry[0]
        local, deps = entry[3]["symbols"][name][:2]
        if local and (kind is None or kind in entry[3]["symbols"][name][4]):
            return True
        for dep in deps:
            target = self.resolve_owner(dep, path)
            if target is None or hops >= _MAX_HOPS:
                return True
            self._note(target[0], used)
            if self.verdict(target[0], target[1], used, seen, hops + 1, kind):
                return True
        return False

    def _note(self, path: Path, used: dict[str, str]) -> None:
        entry = self.entry(path)
        if entry is not None:
            used[str(path)] = entry[0]

    def prefilter_hint(self, path: str, source: str, used: dict[str, str],
                       tree: "Optional[ast.Module] | Callable[[], Optional[ast.Module]]" = None) -> str:
        """Text to add to ``source`` for the prefilter
        (:func:`torchgradlint.prefilter.candidate_rules`), which sees one file
        only: ``" inference_mode"`` when a decorator of the file is a project
        definition that disables grad mode (``" set_grad_enabled"`` when it
        switches it on a flag), else ``""``. Decorators are found by text and
        imports by Python's ``ast`` (only when the file has a decorator that
        is not a torch API). ``used`` collects the files consulted; ``tree``:
        the file's ``ast``, or a function that gives it (``None`` when Python
        rejects the text), when the caller has one (the prefilter's)."""
        names = {n for n in _DECORATOR.findall(source) if n.split(".")[0] not in _PLAIN_DECORATORS}
        if not names:
            return ""
        if callable(tree):
            tree = tree()
        elif tree is None:
            from .prefilter import python_ast

            tree = python_ast(source)
        if tree is None:
            return ""
        imports: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = "." * node.level + (node.module or "")
                for alias in node.names:
                    imports[alias.asname or alias.name] = base + ("" if base.endswith(".") or not base else ".") \
                        + alias.name
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        imports[alias.asname] = alias.name
        importer = Path(os.path.abspath(path))
        hint = ""
        for name in names:
            head, sep, rest = name.partition(".")
            target = self.resolve(imports.get(head, head) + sep + rest, importer)
            if target is None:
                continue
            effect = self.effect(*target)
            self._note(target[0], used)
            if effect == "disabled":
                hint += " inference_mode"
            elif effect == "unknown":
                hint += " set_grad_enabled"
        return hint

    def imports_probabilities(self, path: str, source: str, used: dict[str, str],
                              tree: "Optional[ast.Module] | Callable[[], Optional[ast.Module]]" = None) -> bool:
        """Whether the file ``path`` (text ``source``) imports a module class
        of its project whose ``forward`` returns probabilities (a softmax or
        sigmoid output, or a tuple holding one): the prefilter, which sees
        one file, cannot know that ``loss = ce(Net()(x), y)`` takes one.
        Imports are read from Python's ``ast`` (``tree``: the file's, or a
        function that gives it, when the caller has one); ``used`` collects
        the files consulted."""
        if callable(tree):
            tree = tree()
        elif tree is None:
            from .prefilter import python_ast

            tree = python_ast(source)
        if tree is None:
            return False
        importer = Path(os.path.abspath(path))
        top = list(_module_level(tree.body, source.splitlines()))
        targets = [self.resolve(spec, importer) for spec in _ast_imports(tree, top).values()]
        for node in ast.walk(tree):  # ``import networks`` then ``networks.Policy()``: any class of the module
            if isinstance(node, ast.Import):
                for alias in node.names:
                    module = self._project_module(alias.name, importer)
                    entry = self.entry(module) if module is not None else None
                    if entry is not None and entry[3]:
                        targets += [(module, name) for name in entry[3]["symbols"]]
        for target in targets:
            if target is not None and self.outputs(*target):
                self._note(target[0], used)
                return True
        return False

    def _project_module(self, dotted: str, importer: Path) -> Optional[Path]:
        """The project file that ``import dotted`` in ``importer`` imports, else ``None``."""
        parts = dotted.split(".")
        return None if parts[0] == "torch" else self._first_module(self._bases(importer), parts, importer)

    def _first_module(self, bases: Iterable[Path], parts: Sequence[str], importer: Path) -> Optional[Path]:
        """The first file of the module ``parts`` under ``bases`` (in order) that is not ``importer``."""
        for base in bases:
            found = self._module_file(base, parts)
            if found is not None and found != importer:
                return found
        return None

    def view(self, path: str, module: cst.Module, used: Optional[dict[str, str]] = None) -> "ProjectView":
        """The index as the file ``path`` (parsed as ``module``) sees it;
        ``used``: files already consulted for it (by :meth:`prefilter_hint`)."""
        view = ProjectView(self, Path(os.path.abspath(path)), relative_imports(module))
        view.used.update(used or {})
        return view


class ProjectView:
    """One linted file's window on its :class:`ProjectIndex`: resolves the
    names the file imports and records which project files its result rests
    on (:attr:`used`, for the diagnostics cache)."""

    def __init__(self, index: ProjectIndex, path: Path, relative: dict[str, str]) -> None:
        self.index = index
        self.path = path
        self.relative = relative
        self.used: dict[str, str] = {}
        self.switches_grad = False  # a decorator resolved here disables grad mode or sets it on a flag

    def imports_relatively(self, name: str) -> bool:
        """Whether the file binds ``name`` by a relative import."""
        return name in self.relative

    def _resolve(self, text: str, owner: bool = False) -> Optional[tuple[Path, str]]:
        spec = _spec(text, self.relative)
        target = self.index.resolve_owner(spec, self.path) if owner else self.index.resolve(spec, self.path)
        if target is not None:
            self.index._note(target[0], self.used)
        return target

    def sensitive(self, text: str) -> Optional[bool]:
        """Whether the project definition that ``text`` (a qualified name,
        or one bound by a relative import) names may make a forward depend
        on training mode; ``None`` when it is not one the index can find."""
        if not text:
            return None
        target = self._resolve(text, owner=True)
        if target is None:
            return None
        return self.index.verdict(target[0], target[1], self.used)

    def free_of(self, text: str, kind: str) -> bool:
        """Whether the project definition ``text`` names is shown to hold no
        layer of ``kind`` (``"dropout"``, ``"statistics"``), nor do the
        project definitions it uses; ``False`` when the index cannot find it."""
        target = self._resolve(text, owner=True) if text else None
        return target is not None and not self.index.verdict(target[0], target[1], self.used, kind=kind)

    def decorator(self, text: str) -> Optional[Decorator]:
        """The grad-mode effect of the project definition ``text`` names,
        used as a decorator; ``None`` when the index cannot find it."""
        target = self._resolve(text)
        if target is None:
            return None
        from .analysis.model import GradMode

        effect = self.index.effect(*target)
        self.switches_grad = self.switches_grad or effect is not None
        return Decorator({"disabled": GradMode.DISABLED, "unknown": GradMode.UNKNOWN}.get(effect))

    def forward_kind(self, text: str, index: Optional[int] = None) -> Optional[str]:
        """What the ``forward`` of the project module class ``text`` names
        returns: ``"softmax"``/``"sigmoid"`` for a probability (with
        ``index``: element ``index`` of the tuple it returns), else ``None``
        (also when the index cannot find the class)."""
        target = self._resolve(text)
        outputs = self.index.outputs(*target) if target is not None else None
        if not outputs:
            return None
        whole, elements = outputs
        if index is None:
            return whole
        return elements[index] if index < len(elements) else None

    def meter(self, text: str) -> Optional[bool]:
        """Whether the project class ``text`` names is a running-average
        meter (:meth:`ProjectIndex.meter`); ``None`` when the index cannot
        find it."""
        target = self._resolve(text)
        return self.index.meter(*target) if target is not None else None

    def deps(self) -> list[list[str]]:
        """``[path, sha256]`` of every project file consulted so far."""
        return [[p, d] for p, d in sorted(self.used.items()) if Path(p) != self.path]


def revived_rules(index: "Callable[[], Optional[ProjectIndex]]", path: str, source: str, rules: Sequence,
                  active: Sequence, facts: "FileFacts", used: dict[str, str]) -> tuple[list, list]:
    """The rules beyond the prefilter's candidates ``active`` that facts of
    other project files bring in. The prefilter sees one file: a decorator
    of the project that disables grad mode, or a model class of the
    project whose ``forward`` returns probabilities, is spelled elsewhere.

    Args:
        index: gives the file's project index (or ``None``); called only
            when some rule could be revived, so a file no hint concerns
            never opens it.
        path, source: the file and its text.
        rules: the enabled rules (classes or
            :class:`~torchgradlint.prefilter.PrefilterSpec`).
        active: :func:`~torchgradlint.prefilter.candidate_rules` of the file.
        facts: the prefilter's :class:`~torchgradlint.prefilter.FileFacts`.
        used: collects ``path -> sha256`` of the project files consulted.

    Returns:
        ``(run, revivable)``: rules to run as well, and rules to run only
        if the file's model shows a project decorator that switches grad
        mode (:attr:`ProjectView.switches_grad`).
    """
    from .prefilter import GRAD_HINT, PROBABILITY_HINT, PROBABILITY_HINT_CALLS, candidate_rules

    def beyond(hint: str, calls: Iterable[str] = ()) -> list:
        return [r for r in candidate_rules(source + hint, rules, facts=facts.with_comment(hint, calls))
                if r not in active]

    run: list = []
    revivable = beyond(GRAD_HINT) if len(active) < len(rules) else []
    if revivable and not active and "@" in source:
        project = index()
        hint = project.prefilter_hint(path, source, used, lambda: facts.tree) if project is not None else ""
        if hint:
            run = beyond("\n#" + hint)
            revivable = [r for r in revivable if r not in run]
    probable = [r for r in beyond(PROBABILITY_HINT, PROBABILITY_HINT_CALLS) if r not in run] \
        if len(active) + len(run) < len(rules) else []
    if probable:
        project = index()
        if project is not None and project.imports_probabilities(path, source, used, lambda: facts.tree):
            run += probable
    return run, revivable


_OPEN: dict[tuple[str, Optional[str]], ProjectIndex] = {}


def open_index(root: "str | os.PathLike[str]", store: "Optional[str | os.PathLike[str]]" = None, *,
               fresh: bool = False) -> ProjectIndex:
    """The process's :class:`ProjectIndex` of ``root`` (one per root and
    store, so a worker process keeps its summaries from file to file; a
    forked worker inherits its parent's). ``fresh``: start a new one (a new
    run: files may have changed since the last)."""
    key = (str(root), None if store is None else str(store))
    index = _OPEN.get(key)
    if index is None or fresh:
        index = _OPEN[key] = ProjectIndex(Path(root), None if store is None else Path(store))
    return index


def store_path(cache: object, root: Path) -> Path:
    """Where the summaries of the project ``root`` live in the cache folder
    of ``cache`` (:class:`torchgradlint.cache.Cache`)."""
    name = hashlib.sha256(str(root).encode("utf-8", "surrogateescape")).hexdigest()[:16]
    return cache.index_path.parent / f"project-{name}.json"  # type: ignore[attr-defined]


def indexes_for(paths: Sequence[str], cache: object = None,
                enabled: Optional["Callable[[str], bool]"] = None) -> "Callable[[str], Optional[ProjectIndex]]":
    """For a run over ``paths`` (what the command line named), the function
    that gives a linted file its :class:`ProjectIndex`: one per project root
    (:func:`find_root`, falling back to the common folder of ``paths``),
    stored in ``cache`` (:class:`torchgradlint.cache.Cache`, or ``None``: in
    memory only); ``None`` for a file ``enabled`` turns it off for."""
    fallback = common_folder(paths)
    opened: dict[Path, ProjectIndex] = {}
    markers: dict[str, bool] = {}

    def index_for(path: str) -> Optional[ProjectIndex]:
        if enabled is not None and not enabled(path):
            return None
        root = find_root(path, fallback, markers)
        if root is None:
            return None
        if root not in opened:
            opened[root] = open_index(root, store_path(cache, root) if cache is not None else None, fresh=True)
        return opened[root]

    return index_for
