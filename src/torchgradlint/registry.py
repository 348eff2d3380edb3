"""Rule base class, rule discovery and selection by code, code prefix or name.

Codes: ``TGL0xx`` gradient correctness, ``TGL1xx`` graph and memory retention,
``TGL2xx`` train/eval mode, ``TGL9xx`` opinionated advice (off by default).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Iterable, Iterator, Optional, Sequence

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

    Subclasses set the class attributes and implement :meth:`check`. A rule
    never walks raw syntax on its own where the shared analysis layer
    (:mod:`torchgradlint.analysis`) has the fact; it asks the model.

    Class attributes:
        code: ``TGLnnn``.
        name: kebab-case name, usable in ``--select``.
        summary: one line, shown by ``torchgradlint rule --all``.
        docs: Markdown with ruff's headings (What it does / Why is this bad? /
            Example / Use instead / References).
        default_enabled: ``False`` for ``TGL9xx`` advice.
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
    """

    code: ClassVar[str] = ""
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    docs: ClassVar[str] = ""
    default_enabled: ClassVar[bool] = True
    prefilter: ClassVar[tuple[tuple[str, ...], ...]] = ()
    needs_backward: ClassVar[bool] = False
    needs_grad_evidence: ClassVar[bool] = False

    def check(self, model: "FileModel") -> Iterator[Finding]:  # pragma: no cover - abstract
        """Yield findings for one file's analysis model."""
        raise NotImplementedError

    @classmethod
    def url(cls) -> str:
        """Link to the rule's documentation page."""
        return DOCS_URL.format(code=cls.code)

    @classmethod
    def may_fire(cls, source: str) -> bool:
        """Cheap text test: ``False`` means the rule cannot fire on ``source``."""
        from .prefilter import text_matches

        return text_matches(cls.prefilter, source)


_RULES: Optional[list[type[Rule]]] = None


def all_rules() -> list[type[Rule]]:
    """Every rule class shipped in :mod:`torchgradlint.rules`, sorted by code.

    Raises:
        RuntimeError: two rules share a code or a name, or a code is malformed.
    """
    global _RULES
    if _RULES is None:
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
        _RULES = sorted(found, key=lambda r: r.code)
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


def _matches(rule: type[Rule], selector: str) -> bool:
    sel = selector.strip()
    if sel.upper() == "ALL":
        return True
    if sel.lower() == rule.name:
        return True
    return sel.upper().startswith("TGL") and rule.code.startswith(sel.upper())


def _check_selectors(selectors: Iterable[str]) -> None:
    rules = all_rules()
    for sel in selectors:
        if not any(_matches(r, sel) for r in rules):
            raise SelectionError(
                f"unknown rule selector {sel!r}: expected a code (TGL001), "
                "a code prefix (TGL0, TGL), a rule name (missing-zero-grad) or ALL"
            )


def select_rules(
    select: Optional[Sequence[str]] = None,
    ignore: Sequence[str] = (),
    extend_select: Sequence[str] = (),
) -> list[type[Rule]]:
    """Resolve selectors to rule classes, ruff-style.

    ``select`` replaces the default set (rules with ``default_enabled``);
    ``extend_select`` adds to it; ``ignore`` removes, and wins over both.

    Raises:
        SelectionError: a selector matches no rule.
    """
    _check_selectors([*(select or ()), *ignore, *extend_select])
    rules = all_rules()
    if select is None:
        chosen = {r for r in rules if r.default_enabled}
    else:
        chosen = {r for r in rules if any(_matches(r, s) for s in select)}
    chosen |= {r for r in rules if any(_matches(r, s) for s in extend_select)}
    chosen = {r for r in chosen if not any(_matches(r, s) for s in ignore)}
    return sorted(chosen, key=lambda r: r.code)
