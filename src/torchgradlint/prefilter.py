"""Decide cheaply, before the LibCST parse, which rules can fire on a file.

The LibCST parse is most of a lint's cost (see ``docs/performance.md``), so a
file that cannot hold a finding must never reach it. Two stages, each proven
never to drop a finding (``tests/test_prefilter.py``):

1. **Text.** The file must mention one of :data:`TORCH_HINTS` and must not
   be another framework's code (:func:`is_other_framework_code`: no
   ``torch`` anywhere and an import of MXNet, TensorFlow, JAX, ...; a scope
   decision, not a proof: the rules' PyTorch premises do not hold there), and a rule is
   a candidate only if its substring groups (:attr:`Rule.prefilter`) match.
   A rule with :attr:`Rule.needs_backward` (it fires only at or around a
   backward call) is a candidate only if the file can call one
   (:func:`may_call_backward`): a ``.backward`` / ``.manual_backward``
   attribute, or ``autograd`` spelled somewhere. The word "backward" in a
   name (``backward_hook``), a docstring or an LSTM's direction is not one.
2. **Syntax**, on Python's built-in :mod:`ast` (about a tenth of a LibCST
   parse, and free in the flake8 plugin, which gets flake8's tree). Only for
   rules with :attr:`Rule.needs_grad_evidence`: rules that can fire only
   where a backward runs in the same function or where code runs with grad
   mode *known* enabled inside a loop (TGL101). Grad mode is known enabled
   only at module or class scope, under ``torch.enable_grad()`` /
   ``set_grad_enabled(True)``, or in a function whose same-file call sites
   all run with it enabled (``FileModel.base_mode``). So a file that cannot
   call a backward, spells none of :data:`GRAD_EVIDENCE` and runs, at module
   or class scope, no loop and no call to a function it defines cannot hold
   such a finding: those rules are dropped from the file's candidates (the
   file is not parsed when no other rule is left).
   Library modules (methods only) are the common case: on lightning 2.6.6
   this stage keeps 140 of the 210 torch files away from LibCST.
   A rule may also name a premise of its own (:attr:`Rule.ast_prefilter`,
   :data:`AST_PREFILTERS`, over :class:`FileFacts`: the text, the tree and
   one scan of its calls): TGL006 needs an ``__init__`` that stores on
   ``self`` a container that can hold a layer or a ``requires_grad`` tensor,
   TGL007 a layer-named call in ``forward`` or a method it reaches, TGL101 a
   lasting store in code that runs with grad mode known enabled
   (definition-time code and the functions it reaches by name) unless a
   backward or grad evidence is spelled, TGL201 a grad-mode API, a
   ``.train(`` or a backward call, TGL202 an ``eval()`` / ``train(False)``
   call, TGL203 a functional dropout or SDPA call, TGL302 a gradient scaler,
   TGL303 a softmax/sigmoid call and a logits-loss or ``log`` call. On the
   29 PyPI packages these two stages keep 817 files for the parser instead
   of 1,819 (checked against the full analysis on 8,771 files of the
   corpora, the PyPI packages, the fixtures, the dev set and the shapes: no
   finding dropped; ``realcode/check_prefilter.py``). Stage 2 runs only for
   a file that no premise-less rule keeps: one it keeps is parsed anyway,
   and the premises would cost more than the rule checks they could skip.

PyTorch docs: "Locally disabling gradient computation"
(https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation).
"""

from __future__ import annotations

import ast
import re
import unicodedata
import warnings
from typing import TYPE_CHECKING, Iterable, Iterator, Optional, Sequence

from .analysis.meters import METER_UPDATE
from .analysis.torch_api import (CONVENTIONAL, DATA_SOURCE_NAME, DROPOUT_MODULES, FUNCTIONAL_DROPOUTS,
                                 LOGIT_LOSS_FUNCTIONS, LOGIT_LOSS_MODULES, MODULE_RETURNING_METHODS,
                                 PROBABILITY_FUNCTIONS, PROBABILITY_MODULES, SCALER_NAME, SDPA,
                                 STORE_METHODS, TORCH_DROPOUTS, last_names)

if TYPE_CHECKING:  # pragma: no cover
    from .registry import Rule

# A file that mentions none of these cannot hold a finding of any rule.
TORCH_HINTS = ("torch", "backward")

# Array frameworks with their own autograd. A file that imports one of these
# and never spells "torch" is that framework's code, not PyTorch's: its
# ``backward()`` follows other rules (MXNet overwrites gradients by default,
# ``grad_req="write"``; Paddle resets them with ``clear_grad()``), so a
# finding there would be a false positive. Such a file is not linted.
OTHER_FRAMEWORKS = ("mxnet", "tensorflow", "jax", "paddle", "mindspore", "oneflow")
_OTHER_FRAMEWORK_IMPORT = re.compile(
    r"^[ \t]*(?:import|from)[ \t]+(?:%s)\b" % "|".join(OTHER_FRAMEWORKS), re.MULTILINE)

# Spellings of the APIs that enable grad mode, and of ``torch.autograd``
# (``torch.autograd.grad`` / ``.backward`` cannot be reached, however
# imported, without spelling it).
GRAD_EVIDENCE = ("autograd", "enable_grad", "set_grad_enabled")

# What ``analysis.steps.backward_call`` recognises besides ``torch.autograd``:
# a call of a ``.backward`` or ``.manual_backward`` attribute. Between the dot
# and the name Python allows spaces, line continuations and, inside brackets,
# newlines and comments; all are matched. Strings and comments that merely
# look like one only keep a file (never drop a finding). A comment is matched
# through its newline so that the gap splits one way only: ``#[^\n]*`` alone
# made a banner line (``.`` then a line of 30 ``#``) backtrack exponentially.
_BACKWARD_ATTRIBUTE = re.compile(r"\.(?:[ \t\f\r\n\\]|#[^\n]*\n)*(?:manual_)?backward\b")

# The name after every ``def`` keyword: a superset (strings and comments
# included) of the functions a file defines, found without walking the whole
# ``ast`` (which cost as much as building it). Python allows spaces, tabs,
# form feeds and line continuations between ``def`` and the name; the name is
# taken up to the parameters (``(``) or type parameters (``[``), so that no
# identifier character outside ``\w`` can cut it short, and NFKC-normalised
# as Python normalises identifiers (:func:`_defined_names`).
_DEF_NAME = re.compile(r"\bdef(?:[ \t\f]|\\\r?\n)+([^\s(\[\\]+)")

_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)
_LOOPS = (ast.For, ast.AsyncFor, ast.While, ast.comprehension)


def python_ast(source: str) -> Optional[ast.Module]:
    """``ast.parse(source)`` with warnings silenced, or ``None`` when Python's
    own parser rejects the text (LibCST then reports the syntax error)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None


def runs_code_at_definition_time(tree: ast.Module, source: str) -> bool:
    """Whether module or class scope (code that runs when the file is
    imported or run) holds a loop, a comprehension, a mention of ``self``, or
    a call to a function whose name the file defines (matched on the last
    name of the callee, as ``FileModel.callers_of`` resolves calls).

    ``tree`` is ``source``'s Python ``ast``. Function bodies are skipped;
    their decorators, defaults and annotations (evaluated at definition time)
    are not. Lambdas are walked (a conservative over-approximation). The
    defined names are read from ``source`` by :data:`_DEF_NAME`, which may
    also find a ``def`` in a string or comment: that can only answer ``True``
    more often.
    """
    called: set[str] = set()
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, _DEFS):
            stack.extend(node.decorator_list)
            stack.append(node.args)
            if node.returns is not None:
                stack.append(node.returns)
            continue
        if isinstance(node, _LOOPS):
            return True
        if isinstance(node, ast.Name) and node.id == "self":
            return True
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Name):
                called.add(f.id)
            elif isinstance(f, ast.Attribute):
                called.add(f.attr)
        stack.extend(ast.iter_child_nodes(node))
    return bool(called) and not called.isdisjoint(_defined_names(source))


def _defined_names(source: str) -> set[str]:
    """The names :data:`_DEF_NAME` finds in ``source``, as Python reads them
    (NFKC-normalised: ``def ﬁt()`` defines ``fit``)."""
    names = set(_DEF_NAME.findall(source))
    if not all(name.isascii() for name in names):
        names = {unicodedata.normalize("NFKC", name) for name in names}
    return names


def text_matches(groups: Sequence[Sequence[str]], source: str) -> bool:
    """Stage 1's test of one rule: for every group, ``source`` contains at
    least one of the group's strings (:attr:`Rule.prefilter`)."""
    return all(any(tok in source for tok in group) for group in groups)


class PrefilterSpec:
    """A rule's prefilter metadata without the rule (for the flake8 plugin,
    which must not import the rules or LibCST for a file ruled out here).
    Quacks like a :class:`~torchgradlint.registry.Rule` for
    :func:`candidate_rules`."""

    def __init__(self, code: str, prefilter: Sequence[Sequence[str]], needs_backward: bool,
                 needs_grad_evidence: bool, ast_prefilter: str = "") -> None:
        self.code = code
        self.prefilter = prefilter
        self.needs_backward = needs_backward
        self.needs_grad_evidence = needs_grad_evidence
        self.ast_prefilter = ast_prefilter

    def may_fire(self, source: str) -> bool:
        """See :meth:`Rule.may_fire`."""
        return text_matches(self.prefilter, source)


def may_call_backward(source: str) -> bool:
    """``False`` only when ``source`` holds no call that
    ``analysis.steps.backward_call`` classifies as a backward: no
    ``.backward`` / ``.manual_backward`` attribute and no ``autograd``."""
    return "autograd" in source or _BACKWARD_ATTRIBUTE.search(source) is not None


def candidate_rules(source: str, rules: Sequence[type["Rule"]], tree: Optional[ast.Module] = None,
                    facts: Optional["FileFacts"] = None) -> list[type["Rule"]]:
    """The rules of ``rules`` that can fire on ``source``; empty means the
    file need not be parsed.

    Args:
        source: the file's text.
        rules: enabled rule classes.
        tree: the file's Python ``ast`` if the caller already has it (the
            flake8 plugin); otherwise it is built only when stage 2 needs it.
        facts: a :class:`FileFacts` of ``source`` (or of the same code with
            comments added: :meth:`FileFacts.with_comment`) to share the tree
            and the call scan between calls; ``tree`` is then ignored.
    """
    if not any(h in source for h in TORCH_HINTS) or is_other_framework_code(source):
        return []
    active = [r for r in rules if r.may_fire(source)]
    if any(r.needs_backward for r in active) and not may_call_backward(source):
        active = [r for r in active if not r.needs_backward]
    if any(not r.needs_grad_evidence and not getattr(r, "ast_prefilter", "") for r in active):
        # The file is parsed anyway (a rule without a premise may fire): the ast stage could only
        # skip a few rule checks, which cost less than building Python's ``ast`` for it.
        return active
    if facts is None:
        facts = FileFacts(source, tree)  # builds the tree at most once, when a premise needs it
    if any(r.needs_grad_evidence for r in active) and _lacks_grad_evidence(facts):
        active = [r for r in active if not r.needs_grad_evidence]
    if any(getattr(r, "ast_prefilter", "") for r in active):
        active = [r for r in active if not getattr(r, "ast_prefilter", "") or facts.holds(r.ast_prefilter)]
    return active


class FileFacts:
    """What stage 2's per-rule premises read about one file, each computed at
    most once: the text, Python's ``ast`` (``None`` when Python's parser
    rejects the text; every premise then keeps the file) and one scan of
    that tree's calls.

    The scan (:meth:`_scan`, one :func:`ast.walk`, about a thirtieth of a
    LibCST parse) records the *called names*: the last name of every call's
    callee (``F.dropout(x)`` -> ``dropout``, ``nn.CrossEntropyLoss()`` ->
    ``CrossEntropyLoss``) and, for a callee bound by an import alias (``from
    torch.nn.functional import dropout as drop``), the imported name too, and
    for a callee bound by a module-level alias (``drop = F.dropout``,
    :func:`_module_level_aliases`), every last name it may be bound to. The
    analysis resolves callees through the imports and those aliases only
    (``names.ImportTable``, whose canonical forms keep the last name), so a
    call the rules match as ``torch.nn.functional.dropout`` always leaves
    ``dropout`` here.
    """

    def __init__(self, source: str, tree: Optional[ast.Module] = None) -> None:
        self.source = source
        # the tree and the scan's results, shared with :meth:`with_comment`'s copies
        self._shared: dict[str, object] = {"tree": tree} if tree is not None else {}
        self._verdicts: dict[str, bool] = {}  # premise name -> verdict, for this text
        self._extra_called: frozenset[str] = frozenset()  # see :meth:`with_comment`

    def with_comment(self, comment: str, calls: Iterable[str] = ()) -> "FileFacts":
        """The facts of this file's text with ``comment`` (comment lines only)
        appended: the same tree and call scan, each built at most once for
        both, and only when a premise asks; ``calls``: names the copy's
        :attr:`called` adds (what another file of the project is known to
        call for this one: a softmax in an imported model's ``forward``)."""
        other = FileFacts(self.source + comment)
        other._shared = self._shared
        other._extra_called = frozenset(calls)
        return other

    @property
    def tree(self) -> Optional[ast.Module]:
        """The file's Python ``ast``, built on first use."""
        if "tree" not in self._shared:
            self._shared["tree"] = python_ast(self.source)
        return self._shared["tree"]  # type: ignore[return-value]

    @property
    def built_tree(self) -> Optional[ast.Module]:
        """The tree if it was given or already built, else ``None`` (never builds it)."""
        return self._shared.get("tree")  # type: ignore[return-value]

    def holds(self, premise: str) -> bool:
        """The verdict of the premise named ``premise`` (:data:`AST_PREFILTERS`),
        computed once per :class:`FileFacts`."""
        verdict = self._verdicts.get(premise)
        if verdict is None:
            verdict = self._verdicts[premise] = bool(AST_PREFILTERS[premise](self))
        return verdict

    @property
    def called(self) -> set[str]:
        """The called names (see the class docstring); empty without a tree."""
        if "called" not in self._shared:
            self._scan()
        called: set[str] = self._shared["called"]  # type: ignore[assignment]
        return called | self._extra_called if self._extra_called else called

    @property
    def switches_to_eval(self) -> bool:
        """Whether the file calls ``m.eval()`` or ``m.train(False)`` (``m`` any receiver)."""
        _ = self.called
        return bool(self._shared["eval"])

    @property
    def steps_or_scales_a_scaler(self) -> bool:
        """Whether the file calls ``.step(...)`` / ``.scale(...)`` on a dotted name ending in "scaler"."""
        _ = self.called
        return bool(self._shared["scaler"])

    def _scan(self) -> None:
        tree = self.tree
        called: set[str] = set()
        aliases: dict[str, str] = {}
        evals = scaler = False
        for node in ast.walk(tree) if tree is not None else ():
            if isinstance(node, ast.Call):
                f = node.func
                if isinstance(f, ast.Attribute):
                    called.add(f.attr)
                    if f.attr in ("step", "scale") and SCALER_NAME.search(_last_name(f.value)):
                        scaler = True
                    elif f.attr == "eval" and not node.args and not node.keywords:
                        evals = True
                    elif f.attr == "train" and _literal_false(
                            node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "mode"),
                                                                None)):
                        evals = True
                elif isinstance(f, ast.Name):
                    called.add(f.id)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if a.asname:
                        aliases[a.asname] = a.name.rsplit(".", 1)[-1]
        called |= {aliases[n] for n in called.intersection(aliases)}
        assigned = _module_level_aliases(tree, aliases) if tree is not None else {}
        for n in called.intersection(assigned):
            called |= assigned[n]
        self._shared.update(called=called, eval=evals, scaler=scaler, imported=aliases, assigned=assigned)

    @property
    def imported(self) -> dict[str, str]:
        """``local name -> last name`` of every ``import ... as`` alias
        (``from torch.nn.functional import dropout as drop``: ``drop -> dropout``)."""
        _ = self.called
        return self._shared["imported"]  # type: ignore[return-value]

    @property
    def assigned(self) -> dict[str, set[str]]:
        """:func:`_module_level_aliases` of the file (empty without a tree)."""
        _ = self.called
        return self._shared["assigned"]  # type: ignore[return-value]

    def last_names(self, callee: str) -> set[str]:
        """Every last name a single-name callee may resolve to through the
        imports and the module-level aliases (itself included)."""
        return {callee, self.imported.get(callee, callee), *self.assigned.get(callee, ())}

    def callee_last_names(self, call: ast.Call) -> set[str]:
        """Every last name ``call``'s callee may resolve to: through
        :meth:`last_names` for a single name, its own last name for a dotted
        one (``F.dropout``), none for any other callee (``f()()``)."""
        chain = _dotted_names(call.func)
        return self.last_names(chain[0]) if len(chain) == 1 else set(chain[-1:])


def _last_name(node: ast.expr) -> str:
    """The last name of a dotted expression (``self.scaler`` -> ``scaler``), else ``""``."""
    if isinstance(node, ast.Attribute) and _dotted(node.value):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _dotted(node: ast.expr) -> bool:
    while isinstance(node, ast.Attribute):
        node = node.value
    return isinstance(node, ast.Name)


def _literal_false(node: Optional[ast.expr]) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


_CONTAINER_DISPLAYS = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp, ast.SetComp, ast.GeneratorExp,
                       ast.DictComp)


def _statements(body: list, into_scopes: bool = True) -> "Iterator[ast.stmt]":
    """Every statement of ``body`` and of the suites nested in it (branches,
    loops, ``with``, ``try``, and function and class bodies unless
    ``into_scopes`` is false: a ``def``/``class`` is then yielded but its
    body is not entered), without walking expressions."""
    stack = list(reversed(body))
    while stack:
        st = stack.pop()
        yield st
        if not into_scopes and isinstance(st, _SCOPES):
            continue
        for name in ("body", "orelse", "finalbody"):
            sub = getattr(st, name, None)
            if isinstance(sub, list):
                stack.extend(reversed(sub))
        for h in getattr(st, "handlers", ()) or ():
            stack.extend(reversed(h.body))
        for case in getattr(st, "cases", ()) or ():
            stack.extend(reversed(case.body))


def _display_may_hold(node: ast.expr, classes: set[str]) -> bool:
    """Whether a container display or comprehension has an element that can be
    a layer constructor or a ``requires_grad`` tensor (what TGL006 reads as an
    item: ``module_class_facts.is_stateful_module_ctor`` /
    ``is_requires_grad_tensor``, which take calls only): a name (it may be
    bound to one), or a call of a capitalised name (``nn.Linear``), of a
    same-file class, with a ``requires_grad`` keyword or of
    ``.requires_grad_``. Literals, attributes, subscripts and calls such as
    ``len(x)`` or ``p.data.clone()`` cannot."""
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = [v for k, v in zip(node.keys, node.values) if k is not None]
    elif isinstance(node, ast.DictComp):
        items = [node.value]
    else:
        items = [node.elt]  # type: ignore[attr-defined]
    for item in items:
        if isinstance(item, ast.Name):
            return True
        if isinstance(item, ast.Call):
            name = _callee_name(item)
            if name == "requires_grad_" or any(k.arg == "requires_grad" for k in item.keywords):
                return True
            while isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute) \
                    and item.func.attr in MODULE_RETURNING_METHODS and isinstance(item.func.value, ast.Call):
                item = item.func.value  # ``nn.Linear(a, b).cuda()``
            name = _callee_name(item) if isinstance(item, ast.Call) else ""
            if name[:1].isupper() or name in classes:
                return True
    return False


def may_hold_unregistered_attribute(facts: FileFacts) -> bool:
    """TGL006's stage-2 premise: the ``__init__`` of a class that may be a
    torch module class (:func:`_may_be_torch_module_class`) assigns to an
    attribute of its first parameter

    - a container display or comprehension, or a repeated list (``[None] * n``),
      or a local name bound to one in that ``__init__``, that either has a
      call or a name among its elements or may be filled by an ``append`` /
      ``extend`` / ``insert`` / ``+=`` / subscript store in that ``__init__``, or
    - a call with a ``requires_grad`` keyword or a ``.requires_grad_(...)`` call, or
    - a method call on a ``Parameter(...)`` call (``nn.Parameter(t).to(device)``).

    ``False`` means no ``self.x = ...`` there can hold layers or trainable
    tensors in a plain container (what the rule reports): ``self.cache = {}``,
    ``self.names = [a.name for a in args]``."""
    tree = facts.tree
    if tree is None:
        return True
    statements = list(_statements(tree.body))
    classes = {st.name for st in statements if isinstance(st, ast.ClassDef)}
    torch_names = _torch_bound_names(statements) | set(facts.assigned)
    for cls in statements:
        if not isinstance(cls, ast.ClassDef) or not _may_be_torch_module_class(cls, classes, torch_names):
            continue
        for st in _statements(cls.body):
            if isinstance(st, _DEFS) and st.name == "__init__" and _init_may_hold(st, classes):
                return True
    return False


def _may_lead_to_torch_nn(qualified: str) -> bool:
    """Whether a name bound to ``qualified`` can head a base class that
    ``modes.module_classes`` accepts: ``torch`` itself, ``torch.nn`` or
    anything under it (``torch.nn.Module``, ``torch.nn.modules``)."""
    return qualified == "torch" or qualified == "torch.nn" or qualified.startswith("torch.nn.")


def _torch_bound_names(statements: list) -> set[str]:
    """Names that may head a torch module class's base: the conventional
    ``nn``/``F`` (:data:`CONVENTIONAL`), what the file's imports bind to
    ``torch``, ``torch.nn`` or something under it (``from torch.nn import
    Module``, ``import torch.nn as tnn``, not ``from torch.utils.data import
    Dataset``) or to a Lightning package (``from lightning import
    LightningModule as LM``), and every module-level ``name = <dotted name>``
    (the builder turns one whose value resolves to torch into an alias,
    ``Base = nn.Module``)."""
    out: set[str] = {"torch", *(k for k, v in CONVENTIONAL.items() if _may_lead_to_torch_nn(v))}
    for st in statements:
        if isinstance(st, ast.ImportFrom) and st.module and not st.level:
            for a in st.names:
                if "lightning" in st.module or _may_lead_to_torch_nn(f"{st.module}.{a.name}"):
                    out.add(a.asname or a.name)
        elif isinstance(st, ast.Import):
            for a in st.names:
                if "lightning" in a.name:
                    out.add(a.asname or a.name.split(".")[0])
                elif a.asname is None and a.name.split(".")[0] == "torch":
                    out.add("torch")
                elif a.asname is not None and _may_lead_to_torch_nn(a.name):
                    out.add(a.asname)
    return out


def _may_be_torch_module_class(cls: ast.ClassDef, classes: set[str], torch_names: set[str]) -> bool:
    """A superset of ``module_class_facts.is_torch_module_class(lenient=True)``:
    the class defines ``forward`` and has a base (lenient), or a base is a
    same-file class, a ``...LightningModule``, or a dotted name headed by one
    of :func:`_torch_bound_names` (what ``modes.module_classes`` resolves
    through the imports and the module-level aliases). A ``Dataset`` from
    ``torch.utils.data`` is none of them."""
    if not cls.bases:
        return False
    if any(isinstance(m, _DEFS) and m.name == "forward" for m in _statements(cls.body)):
        return True
    for base in cls.bases:
        text = ast.unparse(base)
        head = text.split(".")[0].split("[")[0]
        if head in classes or head in torch_names or text.endswith("LightningModule"):
            return True
    return False


def _init_may_hold(init: "ast.FunctionDef | ast.AsyncFunctionDef", classes: set[str]) -> bool:
    params = [*init.args.posonlyargs, *init.args.args]
    if not params:
        return False
    me = params[0].arg
    body = list(_statements(init.body))
    builds = any(isinstance(b, ast.AugAssign) and isinstance(b.op, ast.Add) for b in body) or any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("append", "extend", "insert")
        or isinstance(n, ast.Assign) and any(isinstance(t, ast.Subscript) for t in n.targets)  # ``xs[i] = ...``
        for n in ast.walk(init))
    local: dict[str, bool] = {}
    for b in body:
        if isinstance(b, (ast.Assign, ast.AnnAssign)) and _display(b.value) is not None:
            holds = builds or _display_may_hold(_display(b.value), classes)
            for t in (b.targets if isinstance(b, ast.Assign) else [b.target]):
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        local[n.id] = local.get(n.id, False) or holds
    for b in body:
        if not isinstance(b, (ast.Assign, ast.AnnAssign)) or b.value is None:
            continue
        targets = b.targets if isinstance(b, ast.Assign) else [b.target]
        if len(targets) != 1 or not (isinstance(targets[0], ast.Attribute)
                                     and isinstance(targets[0].value, ast.Name) and targets[0].value.id == me):
            continue
        v = b.value
        shown = _display(v)
        if shown is not None and (builds or _display_may_hold(shown, classes)):
            return True
        if isinstance(v, ast.Name) and local.get(v.id):
            return True
        if isinstance(v, ast.Call) and (any(k.arg == "requires_grad" for k in v.keywords) or (
                isinstance(v.func, ast.Attribute) and v.func.attr == "requires_grad_")):
            return True
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and isinstance(v.func.value, ast.Call) \
                and _callee_name(v.func.value) == "Parameter":
            return True  # ``nn.Parameter(t).to(device)``: converted after wrapping, a plain tensor
    return False


def _display(value: "ast.expr | None") -> "ast.expr | None":
    """The container display ``value`` is, or repeats (``[None] * n``: slots
    filled by ``xs[i] = ...``); ``None`` otherwise."""
    if isinstance(value, _CONTAINER_DISPLAYS):
        return value
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult):
        for side in (value.left, value.right):
            if isinstance(side, ast.List):
                return side
    return None


# The words every parameterised ``torch.nn`` layer's name contains (TGL007's text prefilter).
_LAYER_WORD = re.compile(r"Linear|Bilinear|Conv|Norm|Embedding|RNN|LSTM|GRU|Attention|Transformer|PReLU")


def _callee_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def may_build_layer_in_forward(facts: FileFacts) -> bool:
    """TGL007's stage-2 premise: a class defining ``forward`` calls, in
    ``forward`` or in a method ``forward`` reaches through ``self.m(...)``
    calls (transitively), something named like a parameterised layer
    (``nn.Linear``, ``Conv2d``) or bound to one by an import alias or an
    assignment (``from torch.nn import Linear as L``, ``Dense = nn.Linear``).
    ``False`` means no layer can be built while a forward runs."""
    tree = facts.tree
    if tree is None:
        return True
    aliases: set[str] = {name for name, lasts in facts.assigned.items() if any(map(_LAYER_WORD.search, lasts))}
    for node in _statements(tree.body):  # imports and assignments are statements
        if isinstance(node, ast.ImportFrom):
            aliases |= {a.asname for a in node.names if a.asname and _LAYER_WORD.search(a.name)}
        elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Name, ast.Attribute)) \
                and _LAYER_WORD.search(ast.unparse(node.value)):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    for cls in _statements(tree.body):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {m.name: m for m in cls.body if isinstance(m, _DEFS)}
        todo, seen = ["forward"], set()
        while todo:
            name = todo.pop()
            if name in seen or name not in methods:
                continue
            seen.add(name)
            for node in ast.walk(methods[name]):
                if not isinstance(node, ast.Call):
                    continue
                callee = _callee_name(node)
                if _LAYER_WORD.search(callee) or callee in aliases:
                    return True
                if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                    todo.append(node.func.attr)  # ``self.helper(...)`` (any receiver name: a superset)
    return False


def may_evaluate_trained_module(facts: FileFacts) -> bool:
    """TGL201's premise: the file spells a grad-mode API (``no_grad``,
    ``inference_mode``, ``set_grad_enabled``: the regions it checks; or
    pre-0.4 ``volatile``, the inputs it reads as evaluation ones), or it
    has a ``for`` loop that may walk a data source (:func:`iterates_data_somewhere`:
    the evaluation loop without ``no_grad`` it also reports) and a ``.train(``
    call (a helper's mode switch) or a backward call
    (:func:`may_call_backward`: the training that loop must follow). The word
    "backward" in a comment, a docstring or a name (``backward_compatible``)
    is no backward call."""
    s = facts.source
    if any(t in s for t in ("no_grad", "inference_mode", "set_grad_enabled", "volatile")):
        return True
    if ".train(" not in s and not may_call_backward(s):
        return False
    return facts.tree is None or iterates_data_somewhere(facts.tree)


def iterates_data_somewhere(tree: ast.Module) -> bool:
    """Whether some ``for`` loop of ``tree`` may walk a data source as
    ``analysis.training.iterates_data`` decides it: its target is a tuple, or
    a name or attribute in its iterable matches :data:`DATA_SOURCE_NAME` or is
    a capitalised ``...Loader...`` (a superset: every name of the iterable is
    tried, not only the one that function settles on)."""
    return any(isinstance(st, (ast.For, ast.AsyncFor)) and _may_iterate_data(st) for st in _statements(tree.body))


def _may_iterate_data(loop: "ast.For | ast.AsyncFor") -> bool:
    """Whether ``analysis.training.iterates_data`` may hold for ``loop`` (a
    superset, see :func:`iterates_data_somewhere`)."""
    if isinstance(loop.target, ast.Tuple):
        return True
    for n in ast.walk(loop.iter):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else ""
        if name and (DATA_SOURCE_NAME.search(name) or (name[:1].isupper() and "Loader" in name)):
            return True
    return False


# ``torch.nn.functional`` / ``torch`` dropouts and SDPA (TGL203's calls, by last name).
_DROPOUT_CALLS = last_names(FUNCTIONAL_DROPOUTS | TORCH_DROPOUTS | {SDPA})
# ``torch.nn`` dropout modules (TGL203 reports one built and called at once: ``nn.Dropout(0.25)(x)``).
_DROPOUT_MODULE_NAMES = last_names(DROPOUT_MODULES)


def may_call_functional_dropout(facts: FileFacts) -> bool:
    """TGL203's premise: the file calls a functional dropout, or
    ``scaled_dot_product_attention`` with a dropout probability, through a
    name that can resolve to torch; ``nn.Dropout(...)``, a ``dropout=0.1``
    argument and a dropout module's call (``self.dropout(x)``) are not one,
    but a dropout module built in a method other than ``__init__`` and not
    kept on ``self`` (``nn.Dropout(0.25)(x)`` in ``forward``, with a rate that
    is not a literal 0) is.

    The rule checks calls whose qualified name
    (``analysis.names.ImportTable.qualify``: the callee's first name through
    the imports, the module-level assignments of torch values and the
    conventional ``F``/``nn``/``optim``/``autograd``) is a torch dropout or
    SDPA, without ``*``/``**`` arguments, and SDPA only with ``dropout_p``
    (keyword or fifth positional). So a call counts here when its callee is
    a dotted name whose first name is ``torch``, a conventional name, or a
    name an import or a module-level assignment binds, and whose last name
    (through those bindings' last names) is one of those functions."""
    tree = facts.tree
    if tree is None:
        return True
    if facts.called.isdisjoint(_DROPOUT_CALLS) and facts.called.isdisjoint(_DROPOUT_MODULE_NAMES):
        return False  # (the called names include the aliases' last names)
    heads: set[str] = {"torch", *CONVENTIONAL, *facts.assigned}
    calls: list[ast.Call] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            calls.append(node)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            heads.update(a.asname or a.name.split(".")[0] for a in node.names)
    if not facts.called.isdisjoint(_DROPOUT_MODULE_NAMES) and _dropout_module_built_per_call(tree, heads, facts):
        return True
    for node in calls:
        chain = _dotted_names(node.func)
        if not chain or chain[0] not in heads or any(isinstance(a, ast.Starred) for a in node.args) \
                or any(k.arg is None for k in node.keywords):
            continue
        if any(_dropout_call_may_be_reported(node, last == _SDPA_NAME)
               for last in facts.callee_last_names(node) & _DROPOUT_CALLS):
            return True
    return False


def _dropout_module_built_per_call(tree: ast.Module, heads: set[str], facts: FileFacts) -> bool:
    """Whether a function other than ``__init__`` builds a torch dropout module
    that it does not keep on ``self`` (``nn.Dropout(0.25)(x)`` in ``forward``,
    or in an ``nn.Sequential`` assembled there; TGL203's
    ``_built_per_call``): the callee resolves as in
    :func:`may_call_functional_dropout`, the rate is no literal 0 and reads
    no ``training``."""
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name == "__init__":
            continue
        kept = {id(st.value) for st in ast.walk(fn) if isinstance(st, ast.Assign)
                and any(_mentions_self(t) for t in st.targets)}
        for node in ast.walk(fn):
            if not isinstance(node, ast.Call) or id(node) in kept:
                continue
            chain = _dotted_names(node.func)
            if not chain or chain[0] not in heads or facts.callee_last_names(node).isdisjoint(_DROPOUT_MODULE_NAMES):
                continue
            p = _argument(node, 0, "p")
            if isinstance(p, ast.Constant) and p.value == 0 or p is not None and _mentions_training(p):
                continue
            return True
    return False


def _argument(call: ast.Call, position: int, keyword: str) -> Optional[ast.expr]:
    """``analysis.model.Call.arg``: the keyword argument ``keyword``, else the
    positional one at ``position``."""
    for k in call.keywords:
        if k.arg == keyword:
            return k.value
    return call.args[position] if position < len(call.args) else None


def _mentions_training(node: ast.expr) -> bool:
    """``functional_dropout_ignores_eval._mentions_training``: a name, or the
    last name of a dotted attribute chain (``self.cfg.training``), that
    contains ``training``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and "training" in n.id:
            return True
        if isinstance(n, ast.Attribute) and "training" in n.attr and _dotted(n.value):
            return True
    return False


def _dropout_call_may_be_reported(call: ast.Call, sdpa: bool) -> bool:
    """Whether TGL203 may report this call of a dropout (by last name: a
    functional ``(input, p, training)`` or a torch-level ``(input, p, train)``
    one) or of SDPA: it stays silent when the probability reads ``training``,
    when SDPA has no ``dropout_p``, when a functional dropout gets a
    ``training`` argument and when a torch-level one gets no literal
    ``True`` ``train``. Which of the two kinds a call is, is not known
    here, so a call counts when either kind may be reported."""
    if sdpa:
        p = _argument(call, _SDPA_DROPOUT_POS, "dropout_p")
        return p is not None and not _mentions_training(p)
    p = _argument(call, 1, "p")
    if p is not None and _mentions_training(p):
        return False
    torch_flag = _argument(call, 2, "train")
    if isinstance(torch_flag, ast.Constant) and torch_flag.value is True:
        return True  # a torch-level dropout told to drop in eval mode too
    return _argument(call, 2, "training") is None  # a functional dropout without ``training``


_SDPA_NAME = SDPA.rsplit(".", 1)[-1]
_SDPA_DROPOUT_POS = 4  # SDPA's (query, key, value, attn_mask, dropout_p, ...)


def _dotted_names(node: ast.expr) -> list[str]:
    """The names of a dotted expression (``F.dropout`` -> ``["F", "dropout"]``), else ``[]``."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    names.append(node.id)
    return names[::-1]


def _module_level_aliases(tree: ast.Module, imported: dict[str, str]) -> dict[str, set[str]]:
    """``name -> every last name it may be bound to`` by the module-level
    assignments ``name = <dotted name>`` and ``a, b = <dotted name>, ...``
    (outside functions and classes; in ``if``/``try`` blocks too): what the
    builder may turn into torch aliases (``_assume_conventional_names``,
    which resolves the value through the imports and the aliases made
    before it: ``drop = F.dropout; d = drop``). ``imported`` maps import
    aliases to the last name they import. A superset: every assignment of a
    name counts, whichever the builder keeps."""
    out: dict[str, set[str]] = {}
    for st in _statements(tree.body, into_scopes=False):
        if not isinstance(st, ast.Assign) or len(st.targets) != 1:
            continue
        target, value = st.targets[0], st.value
        if isinstance(target, ast.Name):
            pairs = [(target, value)]
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(value.elts):
            pairs = list(zip(target.elts, value.elts))
        else:
            continue
        for t, v in pairs:
            chain = _dotted_names(v)
            if not isinstance(t, ast.Name) or not chain:
                continue
            lasts = {chain[-1]} if len(chain) > 1 else {imported.get(chain[0], chain[0]), *out.get(chain[0], ())}
            out.setdefault(t.id, set()).update(lasts)
    return out


# TGL303's probabilities and the losses (or a ``log``) they must not go into, by last name.
_PROBABILITY_CALLS = last_names(PROBABILITY_FUNCTIONS) | last_names(PROBABILITY_MODULES)
_LOGIT_LOSS_CALLS = last_names(LOGIT_LOSS_FUNCTIONS) | last_names(LOGIT_LOSS_MODULES) | {"log"}


# What the project index can add for a file with a decorator of its project that switches grad mode
# (:meth:`~torchgradlint.project_index.ProjectIndex.prefilter_hint` gives which).
GRAD_HINT = "\n# inference_mode set_grad_enabled"
# What the project index can add for a file that imports a module class of its project whose
# ``forward`` returns probabilities: a softmax call, as text and as a called name.
PROBABILITY_HINT = "\n# softmax"
PROBABILITY_HINT_CALLS = frozenset({"softmax"})


def may_feed_probabilities_to_loss(facts: FileFacts) -> bool:
    """TGL303's premise: the file calls a softmax/sigmoid (function, method or
    module constructor) and a loss that takes logits or log-probabilities
    (function or module constructor) or a ``log``."""
    called = facts.called
    return facts.tree is None or (not called.isdisjoint(_PROBABILITY_CALLS)
                                  and not called.isdisjoint(_LOGIT_LOSS_CALLS))


def may_use_grad_scaler(facts: FileFacts) -> bool:
    """TGL302's premise (``amp_facts.file_has_scaled_backward`` /
    ``file_steps_a_scaler``): the file constructs a ``GradScaler`` /
    ``ShardedGradScaler``, or calls ``.scale(...)`` / ``.step(...)`` on a
    dotted name ending in "scaler"."""
    return facts.tree is None or facts.steps_or_scales_a_scaler or \
        not facts.called.isdisjoint(("GradScaler", "ShardedGradScaler"))


def may_switch_to_eval(facts: FileFacts) -> bool:
    """TGL202's premise: the file calls ``m.eval()`` or ``m.train(False)``
    (``train_not_restored._switches_to_eval``) somewhere."""
    return facts.tree is None or facts.switches_to_eval


def may_switch_grad_mode_by_statement(facts: FileFacts) -> bool:
    """TGL005's premise: every finding of ``grad_mode_leak`` starts at a
    grad-mode switch made by a statement, not a ``with``: a statement that
    calls ``torch.set_grad_enabled`` (the builder's statement regions) or a
    ``torch.no_grad(...).__enter__()`` call (``_bare_enter``,
    ``summaries.leaves_grad_disabled``). A superset: a callee counts by its
    last name, through import and module-level aliases, whatever it is
    called on and with."""
    tree = facts.tree
    if tree is None:
        return True
    if facts.called.isdisjoint(("set_grad_enabled", "__enter__")):
        return False
    lasts = facts.callee_last_names
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) \
                and "set_grad_enabled" in lasts(node.value):
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__enter__" \
                and isinstance(node.func.value, ast.Call) and "no_grad" in lasts(node.func.value):
            return True
    return False


# What ``loss_kept_with_graph._stores`` reads as a store: these calls, ``+=``,
# ``x = x + v``, ``x = torch.cat([x, v])`` and ``x[k] = v``.
_STORE_METHODS = frozenset(STORE_METHODS) | {METER_UPDATE}  # (a running-average meter's ``update``)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _mentions_self(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "self" for n in ast.walk(node))


def _stores_or_calls(nodes: list, called: set[str], data_loops_only: bool = False) -> bool:
    """Walk one scope's code (nested ``def`` / ``class`` bodies excluded;
    lambdas and comprehensions included) and add the last name of every
    callee to ``called``. Returns whether it holds a store (see
    :data:`_STORE_METHODS`) inside a loop or comprehension, or on a target or
    receiver that mentions ``self`` (a store that outlives the call). With
    ``data_loops_only``, a store whose target or receiver does not mention
    ``self`` counts only inside a ``for`` loop that may walk a data source
    (:func:`_may_iterate_data`): without a backward anywhere in the file no
    loop trains, and ``loss_kept_with_graph._step_loop`` then needs such a
    loop around a store that is not into ``self``."""
    stack = [(n, False, False) for n in nodes]
    found = False
    while stack:
        node, in_loop, in_data = stack.pop()
        counts = in_data or not data_loops_only
        if isinstance(node, _SCOPES):
            stack.extend((d, in_loop, in_data) for d in node.decorator_list)
            if not isinstance(node, ast.ClassDef):
                stack.append((node.args, in_loop, in_data))
            else:
                stack.extend((b, in_loop, in_data) for b in node.bases)
            continue
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            called.add(name)
            if name in _STORE_METHODS and isinstance(f, ast.Attribute) and (
                    in_loop and counts or _mentions_self(f.value)):
                found = True
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            found = found or in_loop and counts or _mentions_self(node.target)
        elif isinstance(node, ast.Assign) and (
                isinstance(node.value, (ast.BinOp, ast.Call)) or any(isinstance(t, ast.Subscript) for t in node.targets)):
            found = found or in_loop and counts or any(_mentions_self(t) for t in node.targets)
        inner = in_loop or isinstance(node, (*_LOOPS, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp))
        data = in_data or isinstance(node, (ast.For, ast.AsyncFor)) and _may_iterate_data(node)
        stack.extend((c, inner, data) for c in ast.iter_child_nodes(node))
    return found


def may_store_with_grad_enabled(facts: FileFacts) -> bool:
    """TGL101's premise, refining stage 2's :func:`lacks_grad_evidence`: a
    finding needs a store (``append``, ``+=``, ``x[k] = v``, ...) that
    outlives a loop iteration (in a loop, or into ``self``;
    ``loss_kept_with_graph._persists``) where grad mode is known enabled, or
    a backward. With a backward call or grad evidence spelled, such a store
    anywhere keeps the file. Without a backward call and without
    :data:`GRAD_EVIDENCE`, grad mode is known enabled only in code that runs
    at definition time (module and class bodies) and in the functions its
    calls reach, transitively, by name (``FileModel.base_mode`` asks every
    same-file call site; a function with none is unknown), so that code must
    hold such a store. Library modules whose top level only defines, and test files whose test
    functions are called by the test runner, hold none."""
    s = facts.source
    tree = facts.tree
    if tree is None:
        return True
    functions: dict[str, list[ast.AST]] = {}
    for st in _statements(tree.body):
        if isinstance(st, _DEFS):
            functions.setdefault(st.name, []).append(st)
    if any(t in s for t in GRAD_EVIDENCE) or may_call_backward(s):
        # grad mode may be known anywhere: a lasting store anywhere is enough
        scratch: set[str] = set()
        return _stores_or_calls(list(tree.body), scratch) or _class_bodies_store(tree, scratch) or any(
            _stores_or_calls(fn.body, scratch) for fns in functions.values() for fn in fns)  # type: ignore[attr-defined]
    called: set[str] = set()  # definition-time code: the module body and every class body
    if _stores_or_calls(list(tree.body), called, True) or _class_bodies_store(tree, called, True):
        return True
    seen: set[str] = set()
    todo = [n for n in called if n in functions]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for fn in functions[name]:
            more: set[str] = set()
            if _stores_or_calls(fn.body, more, True):  # type: ignore[attr-defined]
                return True
            todo.extend(n for n in more if n in functions and n not in seen)
    return False


def _class_bodies_store(tree: ast.Module, called: set[str], data_loops_only: bool = False) -> bool:
    """:func:`_stores_or_calls` over every class body (code that runs when
    the class statement runs), at any depth."""
    return any(_stores_or_calls(cls.body, called, data_loops_only)
               for cls in _statements(tree.body) if isinstance(cls, ast.ClassDef))


# Stage-2 premises a rule names in :attr:`Rule.ast_prefilter`: ``FileFacts`` -> may the rule fire.
AST_PREFILTERS = {"unregistered-attribute": may_hold_unregistered_attribute,
                  "layer-built-in-forward": may_build_layer_in_forward,
                  "evaluates-trained-module": may_evaluate_trained_module,
                  "functional-dropout-call": may_call_functional_dropout,
                  "probabilities-into-loss": may_feed_probabilities_to_loss,
                  "grad-scaler": may_use_grad_scaler,
                  "switches-to-eval": may_switch_to_eval,
                  "grad-switch-statement": may_switch_grad_mode_by_statement,
                  "stores-with-grad-enabled": may_store_with_grad_enabled}


def is_other_framework_code(source: str) -> bool:
    """Whether ``source`` never spells ``torch`` and imports one of
    :data:`OTHER_FRAMEWORKS` (an ``import`` or ``from`` statement at the start
    of a line): then it is that framework's code and no rule applies.

    PyTorch docs: gradients accumulate into ``.grad`` across ``backward()``
    calls ("Autograd mechanics",
    https://pytorch.org/docs/stable/notes/autograd.html); MXNet's default
    ``grad_req="write"`` overwrites them instead, so the rules' premises do
    not hold there.
    """
    return "torch" not in source and _OTHER_FRAMEWORK_IMPORT.search(source) is not None


def lacks_grad_evidence(source: str, tree: Optional[ast.Module] = None) -> bool:
    """Stage 2's verdict: ``True`` when ``source`` cannot call a backward
    (:func:`may_call_backward`), spells none of :data:`GRAD_EVIDENCE` and
    Python's ``ast`` shows no code running at definition time
    (:func:`runs_code_at_definition_time`), so a rule with
    ``needs_grad_evidence`` cannot fire on it. ``False`` also when Python's
    parser rejects the text. ``tree`` is built from ``source`` when not given.
    """
    return _lacks_grad_evidence(FileFacts(source, tree))


def _lacks_grad_evidence(facts: FileFacts) -> bool:
    source = facts.source
    if any(tok in source for tok in GRAD_EVIDENCE) or may_call_backward(source):
        return False
    tree = facts.tree
    return tree is not None and not runs_code_at_definition_time(tree, source)


__all__ = ["TORCH_HINTS", "OTHER_FRAMEWORKS", "GRAD_EVIDENCE", "AST_PREFILTERS", "FileFacts", "text_matches",
           "PrefilterSpec", "GRAD_HINT", "PROBABILITY_HINT", "PROBABILITY_HINT_CALLS",
           "is_other_framework_code", "python_ast",
           "runs_code_at_definition_time", "may_call_backward", "lacks_grad_evidence", "candidate_rules"]
