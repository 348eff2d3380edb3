"""Rule base class, rule discovery and selection by code, code prefix or name.

Codes: ``TGL0xx`` gradient correctness, ``TGL1xx`` graph and memory retention,
``TGL2xx`` train/eval mode, ``TGL9xx`` opinionated advice (off by default).

A rule is one module under :mod:`torchgradlint.rules` that declares everything
about itself on its :class:`Rule` subclass; :func:`all_rules` discovers it.
Selection (:func:`resolve_codes`) works on :mod:`torchgradlint.rule_index`, a
small module generated from the rule classes (``python scripts/gen_docs.py``),
so choosing rules imports neither the rules nor LibCST.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterable, Iterator, NamedTuple, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import libcst as cst

    from .analysis.model import FileModel

DOCS_URL = "https://github.com/torchgradlint/torchgradlint/blob/main/docs/rules/{code}.md"

_CODE_RE = re.compile(r"^TGL\d{3}$")


class SelectionError(ValueError):
    """A ``--select``/``--ignore`` entry names no rule, prefix or kebab name."""


@dataclass(frozen=True)
class Finding:
    """What a rule reports: the node to point at and the message.

    ``message`` is one short line (what and where, in the user's names, at
    most about 100 characters); ``detail`` the rest (why it is a defect and
    the fix), shown by the ``full``, ``json`` and ``sarif`` formats. A
    finding with an empty ``detail`` has its message split by the engine as
    :meth:`from_text` splits it.
    ``fix`` is an optional ``(old_node, new_node)`` pair: the engine turns it
    into a :class:`~torchgradlint.diagnostics.Fix` that replaces exactly the
    span of ``old_node`` with the code of ``new_node``.
    """

    node: cst.CSTNode
    message: str
    fix: Optional[tuple[cst.CSTNode, cst.CSTNode]] = None
    fix_safe: bool = True
    detail: str = ""

    @classmethod
    def from_text(cls, node: "cst.CSTNode", text: str, **kwargs: object) -> "Finding":
        """A finding whose long ``text`` is split into ``message`` (its first
        clause) and ``detail`` (the rest) by
        :func:`~torchgradlint.diagnostics.split_message`."""
        from .diagnostics import split_message

        message, detail = split_message(text)
        return cls(node, message, detail=detail, **kwargs)  # type: ignore[arg-type]


class Rule:
    """Base class of every rule: metadata plus a check over the analysis model.

    A rule is one module under :mod:`torchgradlint.rules` holding one
    subclass that sets the class attributes below and implements
    :meth:`check`; nothing else in the code base lists it. The docs index,
    the mkdocs nav, the README rules table, the rule pages and
    :mod:`torchgradlint.rule_index` are generated from these attributes by
    ``python scripts/gen_docs.py`` (tests check they are current), and
    ``tests/test_rule_docs.py`` lints each rule's "Example" (must fire) and
    "Use instead" (must be silent). A rule never walks raw syntax on its own
    where the shared analysis layer (:mod:`torchgradlint.analysis`) has the
    fact; it asks the model.

    Class attributes:
        code: ``TGLnnn``.
        name: kebab-case name, usable in ``--select``.
        summary: one line, shown by ``torchgradlint rule --all`` and the tables.
        docs: Markdown with ruff's headings, in this order (:data:`DOC_HEADINGS`):
            What it does / Why is this bad? / Example / Use instead /
            Fix safety (only when the rule has an autofix) / References.
        default_enabled: ``False`` for ``TGL9xx`` advice.
        probe: name of the harness probe
            (:data:`torchgradlint.harness.probes.PROBES`) that measures the
            defect on the rule's fixtures; ``""`` when none does yet.
        fix_availability: ``"none"``, ``"sometimes"`` or ``"always"``:
            whether :meth:`check` attaches an autofix (``Finding.fix``).
        prefilter: groups of substrings; a file can hold a finding only if,
            for every group, it contains at least one of the group's strings.
            Used to skip files before parsing; must never drop a finding.
        needs_backward: ``True`` for a rule that fires only in files with a
            call that ``analysis.steps.backward_call`` classifies as a
            backward; :mod:`.prefilter` drops it from files that cannot
            call one (its first, text stage).
        needs_grad_evidence: ``True`` for a rule that fires only where a
            backward runs in the same function or where grad mode is known
            enabled inside a loop; such a rule lets :mod:`.prefilter` skip
            files that show neither (its second, ``ast`` stage).
        ast_prefilter: the name of a predicate in
            :data:`torchgradlint.prefilter.AST_PREFILTERS` over Python's
            ``ast`` of the file, ``False`` only when the rule cannot fire
            there (the prefilter's second stage); ``""`` for none.
    """

    code: ClassVar[str] = ""
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    docs: ClassVar[str] = ""
    default_enabled: ClassVar[bool] = True
    probe: ClassVar[str] = ""
    fix_availability: ClassVar[str] = "none"
    prefilter: ClassVar[tuple[tuple[str, ...], ...]] = ()
    needs_backward: ClassVar[bool] = False
    needs_grad_evidence: ClassVar[bool] = False
    ast_prefilter: ClassVar[str] = ""

    def check(self, model: "FileModel") -> Iterator[Finding]:  # pragma: no cover - abstract
        """Yield findings for one file's analysis model."""
        raise NotImplementedError

    @classmethod
    def may_fire(cls, source: str) -> bool:
        """Cheap text test: ``False`` means the rule cannot fire on ``source``."""
        from .prefilter import text_matches

        return text_matches(cls.prefilter, source)

    @classmethod
    def url(cls) -> str:
        """Link to the rule's documentation page."""
        return DOCS_URL.format(code=cls.code)

    @classmethod
    def section(cls, heading: str) -> str:
        """The Markdown under ``## heading`` in :attr:`docs` (stripped; ``""`` when absent)."""
        m = re.search(rf"^##[ \t]*{re.escape(heading)}[ \t]*$(.*?)(?=^##\s|\Z)", cls.docs, re.M | re.S)
        return m.group(1).strip() if m else ""


DOC_HEADINGS = ("What it does", "Why is this bad?", "Example", "Use instead", "Fix safety", "References")
"""ruff's rule-doc headings, in order; "Fix safety" only for a rule with an autofix."""

FIX_AVAILABILITY = ("none", "sometimes", "always")

REGENERATE = "python scripts/gen_docs.py"
"""The one command that regenerates everything derived from the rule classes."""


def discover_rules() -> list[type[Rule]]:
    """Import every module of :mod:`torchgradlint.rules` and collect its rule
    classes, sorted by code, without checking :mod:`torchgradlint.rule_index`
    (the generator that writes the index uses this; everything else uses
    :func:`all_rules`).

    Raises:
        RuntimeError: two rules share a code or a name, or a code is malformed.
    """
    from . import rules as rules_pkg

    found: list[type[Rule]] = []
    for info in pkgutil.iter_modules(rules_pkg.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{rules_pkg.__name__}.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, type) and issubclass(obj, Rule) and obj is not Rule and obj.code:
                if obj.__module__ == module.__name__:
                    found.append(obj)
    codes = [r.code for r in found]
    names = [r.name for r in found]
    if len(set(codes)) != len(codes) or len(set(names)) != len(names):
        raise RuntimeError(f"duplicate rule code or name among {codes} / {names}")
    for r in found:
        if not _CODE_RE.match(r.code):
            raise RuntimeError(f"malformed rule code {r.code!r} in {r.__module__}")
    return sorted(found, key=lambda r: r.code)


def index_entries(rules: Iterable[type[Rule]]) -> tuple[tuple, ...]:
    """``(code, name, default_enabled, prefilter, needs_backward,
    needs_grad_evidence, ast_prefilter)`` of each rule: the content of
    :data:`torchgradlint.rule_index.RULES`."""
    return tuple((r.code, r.name, bool(r.default_enabled), tuple(tuple(g) for g in r.prefilter),
                  bool(r.needs_backward), bool(r.needs_grad_evidence), str(r.ast_prefilter)) for r in rules)


_RULES: Optional[list[type[Rule]]] = None


def all_rules() -> list[type[Rule]]:
    """Every rule class shipped in :mod:`torchgradlint.rules`, sorted by code
    (imports every rule module, and so LibCST).

    Raises:
        RuntimeError: two rules share a code or a name, a code is malformed,
            or :mod:`torchgradlint.rule_index` no longer matches the rule
            classes (the message says to run :data:`REGENERATE`).
    """
    global _RULES
    if _RULES is None:
        found = discover_rules()
        if index_entries(found) != tuple(rule_index()):
            raise RuntimeError("torchgradlint.rule_index is out of date with the rule classes in "
                               f"torchgradlint.rules; regenerate it: {REGENERATE}")
        _RULES = found
    return list(_RULES)


def get_rule(code_or_name: str) -> type[Rule]:
    """The rule with this exact code (case-insensitive) or kebab name.

    Raises:
        KeyError: no such rule.
    """
    key = code_or_name.strip()
    for r in all_rules():
        if r.code == key.upper() or r.name == key.lower():
            return r
    raise KeyError(code_or_name)


# -- selection: on the generated index, importing no rule -------------------------


class RuleInfo(NamedTuple):
    """What selection and the prefilter need to know of a rule, read from
    :mod:`torchgradlint.rule_index` (the :class:`Rule` attributes of the same
    names); quacks like a rule for :func:`torchgradlint.prefilter.candidate_rules`
    through :class:`torchgradlint.prefilter.PrefilterSpec`."""

    code: str
    name: str
    default_enabled: bool
    prefilter: tuple[tuple[str, ...], ...]
    needs_backward: bool
    needs_grad_evidence: bool
    ast_prefilter: str = ""


def rule_index() -> tuple[RuleInfo, ...]:
    """Every rule's code, name and default, sorted by code, without importing a rule."""
    from .rule_index import RULES

    return tuple(RuleInfo(*r) for r in RULES)


def rule_name(code: str) -> str:
    """The kebab name of the rule ``code``, from the index.

    Raises:
        KeyError: no rule has this code.
    """
    for r in rule_index():
        if r.code == code:
            return r.name
    raise KeyError(code)


@dataclass(frozen=True)
class RuleLayer:
    """One layer of rule selection (a config file, the command line, flake8's choice).

    ``select`` ``None`` keeps the selection of the layer below; selectors are
    codes (``TGL001``), code prefixes (``TGL0``), kebab names or ``ALL``.
    """

    select: Optional[tuple[str, ...]] = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()


def _matches(rule: RuleInfo, selector: str) -> bool:
    sel = selector.strip()
    if sel.upper() == "ALL":
        return True
    if sel.lower() == rule.name:
        return True
    return sel.upper().startswith("TGL") and rule.code.startswith(sel.upper())


def check_selectors(selectors: Iterable[str]) -> None:
    """Raise for the first selector that matches no rule.

    Raises:
        SelectionError: says which selector and what a selector looks like.
    """
    index = rule_index()
    for sel in selectors:
        if not any(_matches(r, sel) for r in index):
            raise SelectionError(
                f"unknown rule selector {sel!r}: expected a code (TGL001), "
                "a code prefix (TGL0, TGL), a rule name (missing-zero-grad) or ALL"
            )


def resolve_codes(layers: Sequence[RuleLayer], per_file_ignores: Sequence[str] = ()) -> tuple[str, ...]:
    """The codes of the enabled rules, sorted: the one select/ignore logic of
    the CLI, the config, per-file-ignores and the flake8 plugin.

    Starts from the rules with ``default_enabled``; each layer in order,
    ruff-style: its ``select`` replaces the selection so far, its
    ``extend_select`` adds, its ``ignore`` removes (and wins over both); then
    ``per_file_ignores`` remove. Imports no rule.

    Raises:
        SelectionError: a selector names no rule.
    """
    check_selectors([s for layer in layers for s in (*(layer.select or ()), *layer.extend_select, *layer.ignore)]
                    + list(per_file_ignores))
    index = rule_index()

    def matching(selectors: Sequence[str]) -> set[str]:
        return {r.code for r in index if any(_matches(r, s) for s in selectors)}

    chosen = {r.code for r in index if r.default_enabled}
    for layer in layers:
        if layer.select is not None:
            chosen = matching(layer.select)
        chosen |= matching(layer.extend_select)
        chosen -= matching(layer.ignore)
    chosen -= matching(per_file_ignores)
    return tuple(sorted(chosen))
