"""Tensor provenance: which expressions hold graph-attached tensors.

A value is *attached* when autograd recorded a graph for it (it has a
``grad_fn`` or is a leaf that requires grad). Sources of attached values:
module calls and loss-function calls evaluated with grad enabled, leaves made
with ``requires_grad=True`` / ``nn.Parameter`` / ``.requires_grad_()``, and
arithmetic or graph-keeping methods (``+``, ``.mean()``, ``.to()``,
``.cpu()``...) over attached values. A value is *detached* when it was made
by ``.item()``, ``.detach()``, ``.tolist()``, ``.numpy()``, ``float()``,
``int()``, ``.data``, a tensor factory without ``requires_grad``, a literal,
or any computation evaluated where grad mode is disabled (``torch.no_grad``,
``torch.inference_mode``, ``set_grad_enabled(False)``, decorated functions).
Anything else is *unknown*; rules stay silent on unknown.

Names are followed through :meth:`FileModel.reaching_binding` (an ambiguous
binding is unknown).

PyTorch docs: "Autograd mechanics" and "Locally disabling gradient
computation" (https://pytorch.org/docs/stable/notes/autograd.html),
``torch.Tensor.detach``, ``torch.Tensor.item``, ``torch.no_grad``.

Public API (used by several rules; names are stable):

- :func:`provenance` / :class:`Provenance` / :class:`State`
- :func:`reaching_binding` (sees through ``with`` bodies)
- :func:`is_graph_attached`, :func:`computed_under_no_grad`
- :func:`module_names`, :func:`is_module_call`, :func:`loss_names`,
  :func:`is_loss_call`, :func:`is_scalar_loss`
- :func:`backward_target_names`, :func:`is_backward_target`, :func:`backpropagated_names`,
  :func:`returned_names`
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from . import modes, torch_api
from .literals import is_literal, literal_bool, literal_value
from .model import (Assign, Call, FileModel, GradMode, Region, Scope, _Located, call_params, enclosing_ifs, names_in,
                    target_element)
from .tree import iter_children, node_types, walk
from .names import dotted_name
from .steps import backward_call, differentiable_step
from .tensor_methods import TENSOR_ATTRIBUTES


class State(enum.Enum):
    """Whether an expression holds a graph-attached tensor."""

    ATTACHED = "attached"
    DETACHED = "detached"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Provenance:
    """What is known about one expression's value.

    ``state``: attached / detached / unknown (see :class:`State`).
    ``no_grad``: for a detached value, the grad-mode regions (or decorated
    functions' regions) under which a computation feeding it dropped the
    graph; empty when it was detached by other means.
    ``explicit``: the nodes that detach explicitly (``.item()``, ``.detach()``,
    ``float(x)``, ``.data``).
    ``sources``: the nodes where its graph starts or grows in a way that
    saves activations: module, loss and function calls evaluated with grad
    enabled, and differentiable operations on requires-grad leaves. An
    attached value with no source is a bare leaf (a parameter): it holds no
    graph of its own.
    ``inference``: it may hold, or derive from, a tensor created under
    ``torch.inference_mode()`` (such a tensor cannot be saved for backward,
    whatever the state; a ``.clone()`` made outside inference mode is a
    normal tensor again).
    ``weak``: attached only on the guess that an unknown callee
    differentiates through its tensor arguments.
    """

    state: State
    no_grad: tuple[Region, ...] = ()
    explicit: tuple[cst.CSTNode, ...] = ()
    sources: tuple[cst.CSTNode, ...] = ()
    inference: bool = False
    weak: bool = False

    @property
    def attached(self) -> bool:
        """``state is ATTACHED``."""
        return self.state is State.ATTACHED

    @property
    def detached(self) -> bool:
        """``state is DETACHED``."""
        return self.state is State.DETACHED


_UNKNOWN = Provenance(State.UNKNOWN)
_UNKNOWN_INFERENCE = Provenance(State.UNKNOWN, inference=True)
_CONST = Provenance(State.DETACHED)

_MAX_DEPTH = 32
_MAX_CALL_DEPTH = 3


def _unknown(inference: bool) -> Provenance:
    return _UNKNOWN_INFERENCE if inference else _UNKNOWN


def _frame_key(frame: dict[str, Provenance]) -> tuple:
    """A hashable key of a call's parameter bindings (nodes and regions by identity)."""
    return tuple((name, p.state, tuple(map(id, p.no_grad)), tuple(map(id, p.explicit)), tuple(map(id, p.sources)),
                  p.inference, p.weak) for name, p in frame.items())


@dataclass
class _Cache:
    modules: Optional[frozenset[str]] = None
    losses: Optional[dict[str, Assign]] = None
    names: dict = field(default_factory=dict)
    backpropagated_bindings: dict = field(default_factory=dict)
    memo: dict = field(default_factory=dict)


def _cache(model: FileModel) -> _Cache:
    return model.cached(_Cache, _Cache)


def call_fact(model: FileModel, node: cst.CSTNode) -> Optional[Call]:
    """The :class:`Call` fact recorded for a call node (``None`` if ``node``
    is no recorded call)."""
    return model.call_for(node)


# -- modules and losses -----------------------------------------------------------
def _is_loss_class(model: FileModel, qn: Optional[str]) -> bool:
    if not qn:
        return False
    last = qn.rsplit(".", 1)[-1]
    if qn.startswith("torch.nn.") and last.endswith("Loss"):
        return True
    return last in modes.module_classes(model) and last.endswith("Loss")


def _is_module_ctor(model: FileModel, node: Optional[cst.BaseExpression]) -> bool:
    """A module constructor (:func:`.modes.constructor_kind`) or a loss-module constructor."""
    if modes.constructor_kind(model, node) is not None:
        return True
    inner = modes.unwrap(node)
    return isinstance(inner, cst.Call) and _is_loss_class(model, model.qualname(inner.func))


def module_names(model: FileModel) -> frozenset[str]:
    """Dotted names known to hold ``nn.Module`` instances
    (:func:`.modes.module_names`), plus names bound to loss modules
    (``criterion = nn.CrossEntropyLoss()``)."""
    c = _cache(model)
    if c.modules is None:
        c.modules = modes.module_names(model) | frozenset(loss_names(model))
    return c.modules


def loss_names(model: FileModel) -> dict[str, Assign]:
    """Dotted names bound to loss-module instances (``criterion =
    nn.CrossEntropyLoss()``), mapped to their binding."""
    c = _cache(model)
    if c.losses is None:
        found: dict[str, Assign] = {}
        for a in model.assigns:
            if a.kind in ("assign", "annassign") and not a.unpacked and isinstance(a.value, cst.Call):
                inner = modes.unwrap(a.value)
                if isinstance(inner, cst.Call) and _is_loss_class(model, model.qualname(inner.func)):
                    for t in a.targets:
                        if t.text:
                            found[t.text] = a
        c.losses = found
    return c.losses


def is_loss_call(model: FileModel, node: cst.CSTNode) -> bool:
    """Whether ``node`` calls a loss function: an ``nn.*Loss`` instance (bound
    in this file or called inline), ``F.<...>_loss``/``F.cross_entropy``...,
    or a name like ``criterion``/``loss_fn``."""
    if type(node) is not cst.Call:
        return False
    func = node.func  # type: ignore[attr-defined]
    if type(func) is cst.Call:
        return _is_loss_class(model, model.qualname(func.func))
    text = dotted_name(func)
    if not text:
        return False
    qn = model.names.qualify(text) or ""
    if qn.startswith("torch.nn.functional."):
        last = qn.rsplit(".", 1)[-1]
        return last in torch_api.LOSS_FUNCTIONALS or last.endswith("_loss")
    if text in loss_names(model):
        return True
    return bool(torch_api.LOSS_NAME.match(text.rsplit(".", 1)[-1]))


def _parameter_free_loss(model: FileModel, node: cst.Call) -> bool:
    """A ``torch.nn.functional`` loss or a ``torch.nn.*Loss`` instance (no
    parameters of its own)."""
    func = node.func
    if isinstance(func, cst.Call):
        return (model.qualname(func.func) or "").startswith("torch.nn.")
    text = dotted_name(func) or ""
    if (model.names.qualify(text) or "").startswith("torch.nn.functional."):
        return True
    binding = loss_names(model).get(text)
    inner = modes.unwrap(binding.value) if binding is not None else None
    return isinstance(inner, cst.Call) and (model.qualname(inner.func) or "").startswith("torch.nn.")


def is_module_call(model: FileModel, node: cst.CSTNode) -> bool:
    """Whether ``node`` calls something known (or precisely named) to be an
    ``nn.Module``: ``model(x)``, ``self.encoder(x)``, ``nn.Linear(2, 2)(x)``,
    ``model.forward(x)``, ``model.generate(x)``."""
    if type(node) is not cst.Call:
        return False
    if type(node.func) is cst.Call:  # type: ignore[attr-defined]
        return _is_module_ctor(model, node.func)
    text = dotted_name(node.func)
    if not text:
        return False
    head_text, _, last_attr = text.rpartition(".")
    if last_attr in torch_api.FORWARD_METHODS and head_text and head_text in module_names(model):
        return True
    if text in module_names(model):
        return True
    if text in ("self", "self.forward"):  # a module class calling its own forward
        fact = call_fact(model, node)
        fn = model.enclosing_function(fact.scope) if fact is not None else None
        return fn is not None and fn.class_name in modes.module_classes(model)
    last = text.rsplit(".", 1)[-1]
    head = text.split(".")[0]
    if not (modes.MODULE_NAME.match(last) and (head == "self" or "." not in text)):
        return False
    # Named like a module, but a function the file defines or imports (``test_model(net, loader)``,
    # ``build_model(cfg)``): its result is whatever it returns, not a forward's output.
    fact = call_fact(model, node)
    if fact is not None and any(s.kind == "function" for s in model.resolve_callee(fact)):
        return False
    return "." in text or text not in model.names.aliases


def _reduction_scalar(node: Optional[cst.BaseExpression]) -> bool:
    if node is None:
        return True
    return literal_value(node) in ("mean", "sum", "batchmean")


def is_scalar_loss(model: FileModel, expr: cst.BaseExpression, at: _Located, _depth: int = 0) -> bool:
    """Whether ``expr`` is certainly a scalar loss (so ``.item()`` works):
    a loss call with a scalar ``reduction``, ``x.mean()``/``x.sum()`` with no
    arguments, or a name bound to one, or a name that is backpropagated with
    ``name.backward()`` and no gradient argument in the same scope."""
    if _depth > 4:
        return False
    if isinstance(expr, cst.Call):
        if isinstance(expr.func, cst.Attribute) and expr.func.attr.value in ("mean", "sum") and not expr.args:
            return True
        if is_loss_call(model, expr):
            red = None
            for a in expr.args:
                if a.keyword is not None and a.keyword.value == "reduction":
                    red = a.value
            if not _reduction_scalar(red):
                return False
            text = dotted_name(expr.func)
            binding = loss_names(model).get(text or "")
            if binding is not None:
                inner = modes.unwrap(binding.value)
                if isinstance(inner, cst.Call):
                    for a in inner.args:
                        if a.keyword is not None and a.keyword.value == "reduction" and not _reduction_scalar(a.value):
                            return False
            elif text and not (model.names.qualify(text) or "").startswith("torch.nn.functional."):
                return False  # a name like ``criterion`` with an unseen constructor
            return True
        return False
    text = dotted_name(expr)
    if text is None:
        return False
    for b in _backward_calls(model, at.scope):
        if (b.call.method == "backward" and dotted_name(b.target) == text and not b.call.node.args):
            return True
    binding = model.reaching_binding(text, at)
    if binding is None or binding.kind not in ("assign", "annassign") or binding.unpacked or binding.value is None:
        return False
    return is_scalar_loss(model, binding.value, binding, _depth + 1)


# -- evaluation ---------------------------------------------------------------------
def _join(parts: list[Provenance]) -> Provenance:
    """The value of a name that may come from any of ``parts`` (branches,
    the previous loop iteration): a state only when all agree."""
    if not parts:
        return _UNKNOWN
    inference = any(p.inference for p in parts)
    attached = [p for p in parts if p.attached]
    if attached and all(p.attached or p.detached for p in parts):
        # attached on some path: the value may hold a graph
        return Provenance(State.ATTACHED, sources=tuple(s for p in attached for s in p.sources),
                          inference=inference, weak=any(p.weak for p in attached))
    if all(p.detached for p in parts):
        return Provenance(State.DETACHED, tuple(r for p in parts for r in p.no_grad),
                          tuple(e for p in parts for e in p.explicit), inference=inference)
    return Provenance(State.UNKNOWN, sources=tuple(s for p in parts if not p.detached for s in p.sources),
                      inference=inference)


def _combine(parts: list[Provenance]) -> Provenance:
    """Result of a differentiable op over ``parts`` (grad enabled)."""
    inference = any(p.inference for p in parts)
    attached = [p for p in parts if p.attached]
    if attached:
        return Provenance(State.ATTACHED, sources=tuple(s for p in parts if not p.detached for s in p.sources),
                          inference=inference, weak=all(p.weak for p in attached))
    if parts and all(p.detached for p in parts):
        return Provenance(State.DETACHED, tuple(r for p in parts for r in p.no_grad),
                          tuple(e for p in parts for e in p.explicit), inference=inference)
    if not parts:
        return _CONST
    return Provenance(State.UNKNOWN, sources=tuple(s for p in parts if not p.detached for s in p.sources),
                      inference=inference)


def _grown(node: cst.CSTNode, parts: list[Provenance]) -> tuple[cst.CSTNode, ...]:
    """Sources of a value that ``node`` computes from ``parts``: the node
    itself and every source of its attached inputs (the graph it extends)."""
    return (node,) + tuple(s for p in parts if p.attached for s in p.sources)


def _no_grad_region(model: FileModel, at: _Located) -> Optional[Region]:
    """The region that disables grad where ``at`` runs (``None`` unless the
    mode there is DISABLED)."""
    if model.grad_mode(at) is not GradMode.DISABLED:
        return None
    if at.region is not None and at.region.mode is GradMode.DISABLED:
        return at.region
    fn = at.scope
    if fn.decorator_region is not None and fn.decorator_region.mode is GradMode.DISABLED:
        return fn.decorator_region
    # disabled through same-file callers: point at the caller's region
    for caller in model.callers_of(fn):
        r = _no_grad_region(model, caller) if caller.scope is not fn else None
        if r is not None:
            return r
    return None


def _detached_twin(a: cst.BaseExpression, b: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """The branch that detaches the other, when one branch of ``a if ... else
    b`` detaches the value the other gives as it is: ``loss.item() if
    torch.is_tensor(loss) else loss``, PODNet's ``flat_loss.item() if
    self._cur_task != 0 else flat_loss`` (the author takes the raw branch
    where the value is no tensor); else ``None``."""
    for one, other in ((a, b), (b, a)):
        if not isinstance(one, cst.Call):
            continue
        func = one.func
        if isinstance(func, cst.Attribute) and func.attr.value in torch_api.DETACHING_METHODS and not one.args:
            inner: Optional[cst.BaseExpression] = func.value
            while isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) \
                    and inner.func.attr.value in ("cpu", "detach", "float", "double", "mean", "sum"):
                inner = inner.func.value
        elif isinstance(func, cst.Name) and func.value in torch_api.DETACHING_BUILTINS and len(one.args) == 1:
            inner = one.args[0].value
        else:
            continue
        if inner is not None and inner.deep_equals(other):
            return one
    return None


def _has_requires_grad_kw(call: cst.Call) -> bool:
    return any(a.keyword is not None and a.keyword.value == "requires_grad" and
               not is_literal(a.value, False) for a in call.args)


_META_KEYWORDS = frozenset({"dim", "keepdim", "dtype", "device", "reduction", "out", "non_blocking", "layout",
                            "memory_format", "requires_grad", "pin_memory", "copy", "generator"})


def _arg_values(call: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in call.args if not (a.keyword is not None and a.keyword.value in _META_KEYWORDS)]


def _requires_grad_later(model: FileModel, text: str, binding: Assign, at: _Located) -> bool:
    """``text.requires_grad_()`` or ``text.requires_grad = ...`` between the
    binding and ``at`` (the leaf then requires grad)."""
    key = ("requires-grad-marks", id(binding.scope))
    marks = model.memo.get(key)
    if marks is None:
        marks = {}
        for c in model.calls_in_scope(binding.scope):
            if c.receiver_text and c.method in ("requires_grad_", "retain_grad"):
                marks.setdefault(c.receiver_text, []).append(c.order)
        for a in model.assigns_in_scope(binding.scope):
            for t in a.targets:
                if t.text and t.text.endswith(".requires_grad"):
                    marks.setdefault(t.text[: -len(".requires_grad")], []).append(a.order)
        model.memo[key] = marks
    return any(binding.order < o < at.order for o in marks.get(text, ()))


def reaching_binding(model: FileModel, text: str, at: _Located) -> Optional[Assign]:
    """:meth:`FileModel.reaching_binding` (kept as a function for callers of
    this module; ``with`` bodies are seen through by the model itself)."""
    return model.reaching_binding(text, at)


def _branch_taken(model: FileModel, test: cst.BaseExpression, at: _Located) -> Optional[bool]:
    """Whether ``test`` holds where ``at`` runs, when ``at`` sits in the body
    or the ``else`` of an ``if`` whose test is the same expression (or its
    ``not``): MrSyee's PPO binds ``a = dist.mean if self.is_test else
    action`` and stores ``a`` under ``if not self.is_test:``. ``None`` when no
    such ``if`` encloses ``at``."""
    code = model.module.code_for_node(test).strip()
    for stmt, inner in enclosing_ifs(at):
        if not (stmt.body is inner or (isinstance(stmt.orelse, cst.Else) and stmt.orelse.body is inner)):
            continue
        cond, holds = stmt.test, stmt.body is inner
        if isinstance(cond, cst.UnaryOperation) and isinstance(cond.operator, cst.Not):
            cond, holds = cond.expression, not holds
        if model.module.code_for_node(cond).strip() == code:
            return holds
    return None


def _backward_roots(target: Optional[cst.BaseExpression]) -> list[cst.BaseExpression]:
    """The named values a backward target backpropagates directly:
    ``loss`` for ``loss``, ``scaler.scale(loss)``, ``loss / k``, ``loss * k``."""
    if target is None:
        return []
    if isinstance(target, (cst.Name, cst.Attribute)):
        return [target]
    if isinstance(target, cst.Subscript):  # ``output["loss"].backward()``: the dict holds a graph
        return _backward_roots(target.value)
    if isinstance(target, cst.Call) and isinstance(target.func, cst.Attribute) and not target.args \
            and target.func.attr.value in ("sum", "mean"):  # ``out.sum().backward()``
        return _backward_roots(target.func.value)
    if isinstance(target, cst.Call) and isinstance(target.func, cst.Attribute) \
            and target.func.attr.value in torch_api.SCALER_PASS_THROUGH and target.args:
        return _backward_roots(target.args[0].value)
    if isinstance(target, cst.BinaryOperation):
        literals = (cst.Integer, cst.Float)
        if isinstance(target.right, literals) or isinstance(target.left, literals):
            other = target.left if isinstance(target.right, literals) else target.right
            return _backward_roots(other)
    return []


def _backpropagated_bindings(model: FileModel, scope: Scope) -> dict[str, set[int]]:
    """Dotted name -> ids of the bindings whose value a backward in
    ``scope`` backpropagates (``loss.backward()`` with that binding of
    ``loss`` reaching it)."""
    c = _cache(model)
    key = id(scope)
    if key not in c.backpropagated_bindings:
        out: dict[str, set[int]] = {}
        for b in _backward_calls(model, scope):
            for root in _backward_roots(b.target):
                text = dotted_name(root)
                if not text:
                    continue
                for binding in model.reaching_bindings(text, b.call):
                    out.setdefault(text, set()).add(id(binding))
        c.backpropagated_bindings[key] = out
    return c.backpropagated_bindings[key]


def _literal_args(fact: Call, callee: Scope) -> dict[str, Optional[bool]]:
    """``True``/``False`` literals a call gives the callee's parameters
    (passed, or left at a literal default)."""
    node = callee.node
    if not isinstance(node, cst.FunctionDef):
        return {}
    p = node.params
    params = [*p.posonly_params, *p.params, *p.kwonly_params]
    names = [x.name.value for x in params]
    offset = 1 if callee.class_name is not None and fact.func_text and "." in fact.func_text else 0
    out: dict[str, Optional[bool]] = {}
    for i, param in enumerate(params):
        value = fact.arg(i - offset, param.name.value) if i >= offset else None
        value = value if value is not None else param.default
        out[names[i]] = literal_bool(value)
    return out


# Node classes :meth:`_Evaluator.expr` reads as constants. It dispatches on
# ``type(node)`` (see :func:`~torchgradlint.analysis.tree.node_types`: an
# ``isinstance`` against LibCST's ABCs runs Python code); none of the classes
# it tests by ``is`` has a subclass.
_CONSTANT_NODES = node_types(cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.FormattedString,
                             cst.ConcatenatedString, cst.Comparison)


class _Evaluator:
    """One evaluation of an expression; follows bindings, same-file calls
    (parameters bound to the caller's arguments) and modules' ``forward``."""

    def __init__(self, model: FileModel) -> None:
        self.m = model
        self.active: set[int] = set()
        self.env: dict[int, dict[str, Provenance]] = {}
        self.literals: dict[int, dict[str, Optional[bool]]] = {}
        self.call_depth = 0
        self.sites: dict[int, _Located] = {}  # callee scope id -> the call site being evaluated
        self.cuts = 0
        self.context: tuple = ()  # the calls being evaluated, as a key (see :meth:`_push`)

    # -- names ------------------------------------------------------------------------
    def name(self, text: str, at: _Located, depth: int) -> Provenance:
        """The value of the name ``text`` where ``at`` runs, memoised per
        file and per context (the same-file calls being evaluated around it,
        with their arguments' values: :attr:`context`)."""
        key = (text, id(at), self.context) if self.context else (text, id(at))
        store = _cache(self.m).names
        if key in store:
            return store[key]
        # A result cut short by a cycle (``h = f(h)``) or by the depth bound is
        # memoised too: it is UNKNOWN where a fresh evaluation might know more,
        # but every query stays linear in the file instead of exponential.
        p = store[key] = self._name(text, at, depth)
        return p

    def _name(self, text: str, at: _Located, depth: int) -> Provenance:
        m = self.m
        bindings = m.reaching_bindings(text, at)
        if not bindings:
            return _UNKNOWN
        parts = [self.binding(text, b, at, depth) for b in bindings]
        p = _join(parts)
        if p.attached and not p.weak:
            return p
        # A value that a backward of this scope backpropagates holds a graph.
        marked = _backpropagated_bindings(m, at.scope).get(text)
        if marked and any(id(b) in marked for b in bindings) and not p.detached \
                and not self._items_replaced(text, bindings[-1], at) and bindings[-1].kind != "for":
            last = bindings[-1]
            src = (last.value,) if last.value is not None else (last.node,)
            return Provenance(State.ATTACHED, sources=p.sources or src, inference=p.inference)
        return p

    def _items_replaced(self, text: str, binding: Assign, at: _Located) -> bool:
        """``d[k] = ...`` between ``binding`` and ``at``: the container's
        items changed (``output["loss"] = output["loss"].detach()``), so a
        backward through one of its old items says nothing about it now."""
        return any(a.order > binding.order and a.order < at.order and a.scope is at.scope
                   and any(t.kind == "subscript" and t.container == text for t in a.targets)
                   for a in self.m.assigns_in_scope(at.scope))

    def binding(self, text: str, b: Assign, at: _Located, depth: int) -> Provenance:
        if b.kind == "param":
            frame = self.env.get(id(b.scope))
            if frame is not None and text in frame:
                return frame[text]
            return _UNKNOWN
        if b.kind == "for" and b.value is not None and not b.unpacked:
            items = self.expr(b.value, b, depth + 1)  # elements of an attached container hold graphs
            return items if items.attached else _unknown(items.inference)
        if b.value is None or b.kind in ("for", "with"):
            return _UNKNOWN
        if _requires_grad_later(self.m, text, b, at):
            return Provenance(State.ATTACHED)
        key = (id(b), text)
        if key in self.active:
            self.cuts += 1
            return _UNKNOWN
        self.active.add(key)  # type: ignore[arg-type]
        try:
            if b.kind in ("assign", "annassign", "walrus"):
                if b.unpacked:
                    return self.element(b, text, depth)
                if isinstance(b.value, cst.IfExp):
                    taken = _branch_taken(self.m, b.value.test, at)
                    if taken is not None:  # ``a if test else c`` read under ``if test:`` / ``if not test:``
                        return self.expr(b.value.body if taken else b.value.orelse, b, depth + 1)
                return self.expr(b.value, b, depth + 1)
            if b.kind == "augassign":
                prev = self.name(text, b, depth + 1) if b.op in ("+=", "-=", "*=", "/=") else _UNKNOWN
                cur = self.expr(b.value, b, depth + 1)
                return self._op(b, [prev, cur], b.node)
            return _UNKNOWN
        finally:
            self.active.discard(key)  # type: ignore[arg-type]

    def element(self, b: Assign, text: str, depth: int) -> Provenance:
        """The value ``text`` takes from an unpacking binding ``a, b = value``."""
        index = target_element(b, text)
        value = b.value
        if index is None or value is None:
            return _UNKNOWN
        if isinstance(value, (cst.Tuple, cst.List)):
            els = value.elements
            if len(els) > index and not any(isinstance(e, cst.StarredElement) for e in els[:index + 1]):
                return self.expr(els[index].value, b, depth + 1)
            return _UNKNOWN
        if isinstance(value, cst.Call):
            returned = self._at_call_site(value, b, depth, self.same_file_call(value, b, depth, index))
            if returned is not None and (returned.attached or returned.detached or not is_module_call(self.m, value)):
                return returned
            if returned is None:
                returned = self.forward_element(value, b, depth, index)
                if returned is not None and returned.detached:
                    return returned  # ``out, _, ratio = model(data)``: the forward returns a number there
                if returned is None and is_module_call(self.m, value) \
                        and torch_api.METRIC_VALUE_NAME.search(text.rsplit(".", 1)[-1]):
                    # ``loss, kl, wacc = model(batch)`` of a forward the file cannot see: an accuracy
                    # is a count of argmax comparisons, no evidence of a graph
                    return _unknown(False)
        whole = self.expr(value, b, depth + 1)
        if whole.attached and not whole.weak:
            return whole  # outputs of a forward, a loss call or a differentiable op
        if whole.attached and isinstance(value, cst.Call) and is_loss_call(self.m, value):
            return Provenance(State.ATTACHED, sources=whole.sources, inference=whole.inference)
        return whole if whole.detached else _unknown(whole.inference)

    # -- same-file functions ---------------------------------------------------------------
    def same_file_call(self, node: cst.Call, at: _Located, depth: int,
                       index: Optional[int] = None) -> Optional[Provenance]:
        """What a call to a same-file function returns (element ``index`` of
        a returned tuple when given), with its parameters bound to the
        arguments; ``None`` when the callee is not a same-file function."""
        m = self.m
        fact = call_fact(m, node)
        if fact is None:
            return None
        callees = [s for s in m.resolve_callee(fact) if s.kind == "function"]
        if len(callees) != 1:
            return None
        callee = callees[0]
        if _abstract(m, callee):
            return None  # ``raise NotImplementedError``: a subclass (maybe in another file) returns the value
        if self.call_depth >= _MAX_CALL_DEPTH or id(callee) in self.env or callee.contains(fact.order):
            return _UNKNOWN
        frame, literals = self._bind_params(fact, callee, at, depth), _literal_args(fact, callee)
        # The result depends on the call (site, element), the arguments' values and the calls being
        # evaluated around it (their frames, literal flags and sites): memoised per file on all of
        # these, so the queries of one file evaluate each call in each context once.
        arguments = (_frame_key(frame), tuple(literals.items()))
        key = ("call", id(node), id(at), index, self.context, arguments)
        memo = _cache(m).memo
        found = memo.get(key)
        if found is None:
            found = memo[key] = self._returned(callee, frame, literals, at, depth, index, arguments)
        return found

    def _returned(self, callee: Scope, frame: dict[str, Provenance], literals: dict[str, Optional[bool]],
                  at: _Located, depth: int, index: Optional[int], arguments: tuple) -> Provenance:
        """What ``callee`` returns (element ``index``) with its parameters bound to ``frame``
        (``arguments``: the key of ``frame`` and ``literals``)."""
        m = self.m
        self._push(callee, frame, literals, at, arguments)
        try:
            parts = []
            for r in m.returns_of(callee):
                if r.value is None:
                    parts.append(_CONST)
                    continue
                value = r.value
                if index is not None:
                    if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) > index:
                        value = value.elements[index].value
                    else:
                        whole = self.expr(value, r, depth + 1)
                        parts.append(whole if whole.detached else _unknown(whole.inference))
                        continue
                parts.append(self.expr(value, r, depth + 1))
            if not parts:
                return _CONST
            return _join(parts)
        finally:
            self._pop(callee)

    def _push(self, callee: Scope, frame: dict[str, Provenance], literals: dict[str, Optional[bool]],
              site: Optional[_Located] = None, arguments: Optional[tuple] = None) -> None:
        """Evaluate inside the same-file function ``callee`` from now on: its
        parameters bound to ``frame`` (and ``literals``; ``arguments``: their
        key when the caller made it), called from ``site`` (``None``: from no
        particular call), one call level deeper. Undone by :meth:`_pop` (a
        ``try``/``finally``, not a context manager: this is the evaluator's
        hottest path)."""
        self.env[id(callee)] = frame
        self.literals[id(callee)] = literals
        if site is not None:
            self.sites[id(callee)] = site
        self.call_depth += 1
        if arguments is None:
            arguments = (_frame_key(frame), tuple(literals.items()))
        self.context += ((id(callee), arguments, id(site)),)

    def _pop(self, callee: Scope) -> None:
        self.context = self.context[:-1]
        self.call_depth -= 1
        del self.env[id(callee)]
        del self.literals[id(callee)]
        self.sites.pop(id(callee), None)

    def region(self, at: _Located) -> Optional[Region]:
        """The region that disables grad where ``at`` runs, for the call
        being evaluated: inside a same-file callee reached from a call site,
        the call site's region (a helper called under ``no_grad`` here and
        under ``@inference_mode`` elsewhere makes no inference tensor here)."""
        if self.m.grad_mode(at) is not GradMode.DISABLED:
            return None
        if at.region is not None and at.region.mode is GradMode.DISABLED:
            return at.region
        fn = self.m.enclosing_function(at.scope)
        if fn is not None and fn.decorator_region is not None and fn.decorator_region.mode is GradMode.DISABLED:
            return fn.decorator_region
        site = self.sites.get(id(fn)) if fn is not None else None
        if site is not None:
            return self.region(site)
        return _no_grad_region(self.m, at)

    def mode(self, at: _Located) -> GradMode:
        """Grad mode where ``at`` runs, for the call being evaluated: a
        ``set_grad_enabled(flag)`` whose flag is a parameter takes the value
        this call passes (or the default it leaves)."""
        region = at.region
        if region is not None and region.flag is not None and isinstance(region.flag, cst.Name):
            fn = self.m.enclosing_function(at.scope)
            literals = self.literals.get(id(fn)) if fn is not None else None
            if literals is not None and literals.get(region.flag.value) is not None:
                return GradMode.ENABLED if literals[region.flag.value] else GradMode.DISABLED
        return self.m.grad_mode(at)

    def _at_call_site(self, node: cst.Call, at: _Located, depth: int,
                      returned: Optional[Provenance]) -> Optional[Provenance]:
        """A same-file call's result with its graph named by the call site
        (two calls of one helper build two graphs) plus its arguments'."""
        if returned is None or not returned.attached:
            return returned
        return Provenance(State.ATTACHED, sources=_grown(node, self._taint(node, at, depth)),
                          inference=returned.inference, weak=returned.weak)

    def _bind_params(self, fact: Call, callee: Scope, at: _Located, depth: int) -> dict[str, Provenance]:
        params = call_params(fact, callee)
        frame: dict[str, Provenance] = {}
        positional = [a for a in fact.node.args if a.keyword is None and not a.star]
        for i, a in enumerate(positional):
            if i < len(params):
                frame[params[i]] = self.expr(a.value, at, depth + 1)
        for a in fact.node.args:
            if a.keyword is not None and a.keyword.value in callee.params:
                frame[a.keyword.value] = self.expr(a.value, at, depth + 1)
        return frame

    def _forward(self, node: cst.Call) -> Optional[Scope]:
        """The ``forward`` of the same-file module class whose instance ``node``
        calls, when it can be evaluated here (not already being evaluated)."""
        m = self.m
        text = dotted_name(node.func)
        if not text:
            return None
        cls = modes.instance_class(m, text, call_fact(m, node))
        if cls is None:
            return None
        fwd = m.classes[cls].methods.get("forward")
        if fwd is None or id(fwd) in self.env or self.call_depth >= _MAX_CALL_DEPTH:
            return None
        return fwd

    def forward_element(self, node: cst.Call, at: _Located, depth: int, index: int) -> Optional[Provenance]:
        """Element ``index`` of the tuple the ``forward`` of the same-file module
        class ``node`` calls returns, whatever its inputs (its parameters
        unknown): detached only where every ``return`` gives there a value that
        holds no graph (``ratio = x.size(0) / n``, ``loss.item()``);
        ``None`` when ``node`` calls no such module."""
        fwd = self._forward(node)
        if fwd is None:
            return None
        returns = [r.value for r in self.m.returns_of(fwd)]
        if not returns or any(not isinstance(v, cst.Tuple) or len(v.elements) <= index
                              or isinstance(v.elements[index].value, _DISPLAYS) for v in returns):
            return None  # a return of one tensor, or a container at ``index`` (``out, (l1, l2) = model(x)``)
        return self._returned(fwd, {}, {}, at, depth, index, (_frame_key({}), ()))

    def module_forward(self, node: cst.Call, at: _Located, depth: int) -> Optional[Provenance]:
        """What a call of a same-file module class instance returns when its
        ``forward`` computes every returned value under no_grad (the module
        cuts the graph); ``None`` otherwise."""
        m = self.m
        fwd = self._forward(node)
        if fwd is None:
            return None
        returns = [r for r in m.returns_of(fwd) if r.value is not None]
        if not returns:
            return None
        regions = []
        for r in returns:
            region = _no_grad_region(m, r)
            if region is None:
                return None
            regions.append(region)
        inference = any(r.api == torch_api.INFERENCE_MODE for r in regions)
        return Provenance(State.DETACHED, tuple(regions), inference=inference)

    def forward_returns_inference(self, fwd: Scope) -> bool:
        """Whether some value ``fwd`` (a same-file ``forward``) returns
        derives from a tensor created under ``torch.inference_mode()`` inside
        it or in what it calls, whatever its arguments are."""
        self._push(fwd, {}, {})
        try:
            return any(self.expr(r.value, r, 1).inference for r in self.m.returns_of(fwd) if r.value is not None)
        finally:
            self._pop(fwd)

    # -- expressions ----------------------------------------------------------------------
    def _op(self, at: _Located, parts: list[Provenance], node: Optional[cst.CSTNode] = None) -> Provenance:
        """A new tensor computed from ``parts`` by ``node`` where ``at`` runs."""
        mode = self.mode(at)
        inference = any(p.inference for p in parts)
        if mode is GradMode.DISABLED:
            region = self.region(at)
            made_in_inference = region is not None and region.api == torch_api.INFERENCE_MODE
            return Provenance(State.DETACHED, (region,) if region else (), inference=inference or made_in_inference)
        if mode is GradMode.ENABLED or any(p.attached and p.sources and not p.weak for p in parts):
            # (an attached part with a graph proves grad mode was on where this scope runs)
            r = _combine(parts)
            if r.attached and not r.sources and node is not None:
                r = Provenance(State.ATTACHED, sources=(node,), inference=r.inference, weak=r.weak)
            return r
        if parts and all(p.detached for p in parts):
            return _combine(parts)
        return _unknown(inference)

    def expr(self, node: Optional[cst.BaseExpression], at: _Located, depth: int = 0) -> Provenance:
        if node is None:
            return _UNKNOWN
        if depth > _MAX_DEPTH:
            self.cuts += 1
            return _UNKNOWN
        kind = type(node)
        if kind in _CONSTANT_NODES:
            return _CONST
        if kind is cst.Name:
            if node.value in ("True", "False", "None"):
                return _CONST
            return self.name(node.value, at, depth)
        if kind is cst.Attribute:
            attr = node.attr.value
            if attr == "data":
                base = self.expr(node.value, at, depth + 1)
                return Provenance(State.DETACHED, explicit=(node,), inference=base.inference)
            if attr in ("grad", "shape", "dtype", "device", "requires_grad", "is_cuda", "ndim", "training"):
                return _CONST
            text = dotted_name(node)
            if text and self.m.reaching_bindings(text, at):
                return self.name(text, at, depth)
            head = text.split(".")[0] if text else None
            if head and head in self.m.names.aliases and not (self.m.names.aliases[head] or "").startswith("torch"):
                return _CONST  # ``np.nan``, ``math.pi``: a constant of an imported module
            if text and text.split(".")[0] in ("self", "cls"):
                return _UNKNOWN
            if attr not in TENSOR_ATTRIBUTES and _hand_written_value(self.m, node.value, at):
                return _unknown(False)  # ``Loss.v``: no ``torch.Tensor`` has that attribute
            base = self.expr(node.value, at, depth + 1)
            if base.attached and not base.weak:
                return base  # ``outputs.loss``, ``out.logits``, ``x.T``
            return _unknown(base.inference)
        if kind is cst.BinaryOperation:
            return self._op(at, [self.expr(node.left, at, depth + 1), self.expr(node.right, at, depth + 1)], node)
        if kind is cst.UnaryOperation:
            if isinstance(node.operator, cst.Not):
                return _CONST
            return self._op(at, [self.expr(node.expression, at, depth + 1)], node)
        if kind is cst.IfExp or kind is cst.BooleanOperation:
            a_node, b_node = (node.body, node.orelse) if kind is cst.IfExp else (node.left, node.right)
            if kind is cst.IfExp:
                detached = _detached_twin(a_node, b_node)
                if detached is not None:
                    return self.expr(detached, at, depth + 1)
            return _join([self.expr(a_node, at, depth + 1), self.expr(b_node, at, depth + 1)])
        if kind is cst.List or kind is cst.Tuple or kind is cst.Set:
            parts = [self.expr(e.value, at, depth + 1) for e in node.elements]
            return self._container(parts)
        if kind is cst.Dict:
            parts = [self.expr(e.value, at, depth + 1) for e in node.elements if isinstance(e, cst.DictElement)]
            return self._container(parts)
        if kind is cst.ListComp or kind is cst.SetComp or kind is cst.GeneratorExp:
            return self._container([self.expr(node.elt, at, depth + 1)])
        if kind is cst.DictComp:
            return self._container([self.expr(node.value, at, depth + 1)])
        if kind is cst.Subscript:
            base = self.expr(node.value, at, depth + 1)
            if base.attached or base.detached:
                return base
            return _unknown(base.inference)
        if kind is cst.Call:
            return self.call(node, at, depth)
        return _UNKNOWN

    @staticmethod
    def _container(parts: list[Provenance]) -> Provenance:
        if any(p.attached for p in parts) or (parts and all(p.detached for p in parts)):
            return _combine(parts)
        return _unknown(any(p.inference for p in parts))

    def _distribution(self, node: cst.BaseExpression, at: _Located) -> bool:
        """Whether ``node`` is a ``torch.distributions`` object: built by a
        class of that package (``Normal(mu, std)``), directly or through the
        one binding of a name that reaches ``at``."""
        node = modes.unwrap(node)
        if isinstance(node, cst.Name):
            binding = reaching_binding(self.m, node.value, at)
            if binding is None or binding.kind != "assign" or binding.unpacked or binding.value is None:
                return False
            node = modes.unwrap(binding.value)
        return isinstance(node, cst.Call) and (self.m.qualname(node.func) or "").startswith("torch.distributions.")

    def _taint(self, node: cst.Call, at: _Located, depth: int) -> list[Provenance]:
        return [self.expr(v, at, depth + 1) for v in _arg_values(node)]

    def call(self, node: cst.Call, at: _Located, depth: int) -> Provenance:
        m = self.m
        func = node.func
        mode = self.mode(at)
        if isinstance(func, cst.Attribute):
            meth = func.attr.value
            if meth in torch_api.DETACHING_METHODS:
                inference = meth == "detach" and self.expr(func.value, at, depth + 1).inference
                return Provenance(State.DETACHED, explicit=(node,), inference=inference)
            if meth in torch_api.OBJECT_METHODS:
                return _CONST
            if meth in torch_api.DISTRIBUTION_SAMPLE_METHODS and self._distribution(func.value, at):
                return Provenance(State.DETACHED, explicit=(node,))  # ``Normal(mu, std).sample()``
            if meth in torch_api.DISTRIBUTION_GRAPH_METHODS and self._distribution(func.value, at):
                # ``Categorical(probs).log_prob(a)``: computed from the distribution's parameters
                return self._op(at, [self.expr(func.value, at, depth + 1),
                                     *(self.expr(v, at, depth + 1) for v in _arg_values(node))], node)
            if meth == "requires_grad_":
                return Provenance(State.ATTACHED)
            if meth in torch_api.SCALER_PASS_THROUGH and "scaler" in (dotted_name(func.value) or "").lower() \
                    and node.args:
                return self.expr(node.args[0].value, at, depth + 1)
        text = dotted_name(func)
        qn = m.names.qualify(text) if text else None
        if text in torch_api.DETACHING_BUILTINS and qn == text:
            return Provenance(State.DETACHED, explicit=(node,))
        if qn in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            return Provenance(State.ATTACHED)
        if qn and qn.startswith("torch.") and qn.rsplit(".", 1)[-1] in torch_api.FACTORIES and qn.count(".") == 1:
            return Provenance(State.ATTACHED) if _has_requires_grad_kw(node) else _CONST
        if is_loss_call(m, node) and (isinstance(func, cst.Call) or self.same_file_call(node, at, depth) is None):
            # (a function the file defines, ``def loss(yhat, y)``, is judged by its body below, not its name)
            parts = self._taint(node, at, depth)
            inference = any(p.inference for p in parts)
            if mode is GradMode.ENABLED:
                if parts and all(p.detached for p in parts):
                    # a loss with parameters of its own would still be attached
                    return _combine(parts) if _parameter_free_loss(m, node) else _unknown(inference)
                return Provenance(State.ATTACHED, sources=_grown(node, parts), inference=inference)
            return self._op(at, parts if mode is GradMode.DISABLED else [_unknown(inference)], node)
        if is_module_call(m, node):
            parts = self._taint(node, at, depth)
            inference = any(p.inference for p in parts) or forward_returns_inference(m, node)
            cut = self.module_forward(node, at, depth)
            if cut is not None:
                return cut
            if mode is GradMode.ENABLED:
                return Provenance(State.ATTACHED, sources=_grown(node, parts), inference=inference)
            return self._op(at, parts if mode is GradMode.DISABLED else [_unknown(inference)], node)
        if isinstance(func, cst.Attribute) and qn and qn.startswith("torch.") and m.names.qualify(
                dotted_name(func.value)) in ("torch", "torch.nn.functional"):
            return self._torch_function(qn, node, at, depth)
        if isinstance(func, cst.Attribute):
            meth = func.attr.value
            if meth in torch_api.GRAPH_KEEPING_METHODS:
                recv = self.expr(func.value, at, depth + 1)
                if meth == "clone" and not self._in_inference(at):
                    recv = Provenance(recv.state, recv.no_grad, recv.explicit, recv.sources, False, recv.weak)
                if mode is GradMode.DISABLED and meth in torch_api.MAY_RETURN_SELF:
                    return recv if recv.detached else _unknown(recv.inference)
                if mode is GradMode.DISABLED:
                    return self._op(at, [recv], node)
                args = [self.expr(v, at, depth + 1) for v in _arg_values(node)
                        if not isinstance(v, (cst.Name, cst.Attribute, cst.SimpleString))]
                if recv.attached:
                    return recv
                if recv.detached and meth in torch_api.MAY_RETURN_SELF:
                    return recv
                return self._op(at, [recv, *args], node) if recv.state is not State.UNKNOWN \
                    else _unknown(recv.inference)
        if qn and qn.startswith("torch."):
            return self._torch_function(qn, node, at, depth)
        if text == "sum" and qn == "sum":
            return self._op(at, [self.expr(v, at, depth + 1) for v in _arg_values(node)], node)
        returned = self._at_call_site(node, at, depth, self.same_file_call(node, at, depth))
        if returned is not None:
            if mode is GradMode.DISABLED and not returned.detached:
                return self._op(at, [returned], node)
            return returned
        if text and qn and qn.split(".")[0] != "torch" and torch_api.DETACHING_CALLEE_NAME.search(text):
            return Provenance(State.DETACHED, explicit=(node,))  # ``torch_item(x)``: named after .item()
        # An unknown callee: its result may carry its tensor arguments' graph.
        parts = self._taint(node, at, depth)
        if isinstance(func, cst.Attribute) and not _foreign_method(m, func):
            parts.append(self.expr(func.value, at, depth + 1))
        inference = any(p.inference for p in parts)
        if mode is GradMode.ENABLED and any(p.attached and p.sources and not p.weak for p in parts):
            return Provenance(State.ATTACHED, sources=_grown(node, parts), inference=inference, weak=True)
        if mode is GradMode.ENABLED:
            # unknown, but if it is a graph, this call is where it is built
            return Provenance(State.UNKNOWN, sources=(node,) + tuple(
                s for p in parts if not p.detached for s in p.sources), inference=inference)
        return _unknown(inference)

    def _in_inference(self, at: _Located) -> bool:
        region = self.region(at)
        return region is not None and region.api == torch_api.INFERENCE_MODE

    def _torch_function(self, qn: str, node: cst.Call, at: _Located, depth: int) -> Provenance:
        last = qn.rsplit(".", 1)[-1]
        functional = qn.startswith("torch.nn.functional.")
        parts = [self.expr(v, at, depth + 1) for v in _arg_values(node)]
        if qn.startswith("torch.distributions.") and parts \
                and (all(p.detached for p in parts) or any(p.attached for p in parts)):
            # ``Normal(mu, sigma)``: a distribution holds its parameters' graph and none of its own
            return self._op(at, parts, node)
        if qn in torch_api.CHECKPOINT and self.mode(at) is GradMode.ENABLED:
            # ``checkpoint(fn, *args)`` runs ``fn``'s forward: its output holds a graph built here
            return Provenance(State.ATTACHED, sources=_grown(node, parts), inference=any(p.inference for p in parts))
        if not ((qn.count(".") == 1 and last in torch_api.DIFFERENTIABLE)
                or (functional and last not in torch_api.FUNCTIONAL_NOT_DIFFERENTIABLE)):
            inference = any(p.inference for p in parts)
            if self.mode(at) is GradMode.ENABLED:  # unknown, but if it is a graph, it is built here
                return Provenance(State.UNKNOWN, sources=(node,) + tuple(
                    s for p in parts if not p.detached for s in p.sources), inference=inference)
            return _unknown(inference)
        return self._op(at, parts, node)


_DISPLAYS = (cst.Tuple, cst.List, cst.Dict, cst.Set, cst.ListComp, cst.DictComp, cst.SetComp)


def _hand_written_value(model: FileModel, value: cst.BaseExpression, at: _Located) -> bool:
    """Whether ``value`` (the object of an attribute read ``value.attr``, where
    ``attr`` is no ``torch.Tensor`` attribute) is the very value a backward of
    its scope backpropagates: a tensor has no such attribute, so the object is
    some other autograd-like value (a course's hand-written ``Var`` whose
    ``.v`` is a float), and what the attribute holds says nothing about a
    torch graph."""
    text = dotted_name(value)
    return bool(text) and text in backward_target_names(model, at.scope) and is_backward_target(model, value, at)


def _foreign_method(model: FileModel, func: cst.Attribute) -> bool:
    """Whether the unknown method ``func`` (``recv.name``) says nothing about
    its receiver's graph: no ``torch.Tensor`` has a method ``name``, so a
    receiver spelled as a name (``loss.get_loss()``, ``self.meter.avg()``) is
    some other object, not the tensor the analysis may take it for. A
    receiver known or named to be a module (``model.encode(x)``) computes
    from its weights and keeps the receiver's part."""
    if func.attr.value in TENSOR_ATTRIBUTES:
        return False
    text = dotted_name(func.value)
    if text is None:
        return False
    return not (modes.is_module(model, text) or modes.MODULE_NAME.match(text.rsplit(".", 1)[-1]))


def _abstract(model: FileModel, fn: Scope) -> bool:
    """Whether the same-file function ``fn`` returns nothing and raises
    ``NotImplementedError`` (an abstract method: what it returns is defined
    by subclasses, not by this body)."""
    key = ("abstract", id(fn))
    if key not in model.memo:
        model.memo[key] = not any(r.value is not None for r in model.returns_of(fn)) and any(
            isinstance(n, cst.Raise) and n.exc is not None
            and dotted_name(n.exc.func if isinstance(n.exc, cst.Call) else n.exc) == "NotImplementedError"
            for n in walk(fn.node))
    return bool(model.memo[key])


def forward_returns_inference(model: FileModel, node: cst.Call) -> bool:
    """Whether ``node`` calls an instance of a same-file module class whose
    ``forward`` returns a value derived from a tensor it (or a helper it
    calls) created under ``torch.inference_mode()``: the output then carries
    an inference tensor into the caller's graph (``x_self_cond`` computed
    under inference mode and fed to the network inside a diffusion model's
    ``forward``). Memoised per class; a recursive ``forward`` counts as not."""
    text = dotted_name(node.func)
    cls = modes.instance_class(model, text, call_fact(model, node)) if text else None
    fwd = model.classes[cls].methods.get("forward") if cls is not None else None
    if fwd is None:
        return False
    memo = _cache(model).memo
    key = ("forward-inference", id(fwd))
    if key not in memo:
        memo[key] = False  # a forward reaching itself adds nothing
        memo[key] = _Evaluator(model).forward_returns_inference(fwd)
    return memo[key]


def provenance(model: FileModel, expr: Optional[cst.BaseExpression], at: _Located) -> Provenance:
    """What is known about the tensor ``expr`` evaluated where the fact ``at``
    runs (``at`` is the call or binding whose statement holds ``expr``).

    Never raises; unknown expressions give ``State.UNKNOWN``.
    """
    key = (id(expr), id(at))
    memo = _cache(model).memo
    if key not in memo:
        memo[key] = _Evaluator(model).expr(expr, at)
    return memo[key]


def module_cuts_graph(model: FileModel, call: Call) -> Optional[Region]:
    """The no_grad region under which the ``forward`` of the same-file
    module class that ``call`` invokes computes everything it returns
    (the module cuts the graph of its inputs), or ``None``."""
    p = _Evaluator(model).module_forward(call.node, call, 0)
    return p.no_grad[0] if p is not None and p.no_grad else None


def loss_like(model: FileModel, expr: cst.BaseExpression, at: _Located) -> bool:
    """Whether ``expr`` reads as a loss term: a name like ``loss``,
    ``imput_mse``, ``kl``, or a value computed by a loss call or a callee
    named like a loss (``GaussianNegLogLik(...)``, ``mse(...)``), followed
    through its binding."""
    for n in walk(expr):
        if isinstance(n, cst.Call):
            text = dotted_name(n.func) or ""
            if is_loss_call(model, n) or torch_api.LOSS_CALLEE_NAME.search(text.rsplit(".", 1)[-1]):
                return True
        elif isinstance(n, cst.Name) and torch_api.LOSS_VALUE_NAME.search(n.value):
            return True
    text = dotted_name(expr)
    if text:
        b = model.reaching_binding(text, at)
        if b is not None and b.value is not None and b.kind in ("assign", "annassign") and b.value is not expr:
            return any(isinstance(n, cst.Call) and torch_api.LOSS_CALLEE_NAME.search(
                (dotted_name(n.func) or "").rsplit(".", 1)[-1]) for n in walk(b.value))
    return False


def is_graph_attached(model: FileModel, expr: Optional[cst.BaseExpression], at: _Located) -> Optional[bool]:
    """``True`` attached, ``False`` detached, ``None`` unknown."""
    p = provenance(model, expr, at)
    return None if p.state is State.UNKNOWN else p.attached


def computed_under_no_grad(model: FileModel, expr: Optional[cst.BaseExpression],
                           at: _Located) -> Optional[Region]:
    """The grad-disabling region that left ``expr`` without a graph, or
    ``None``.

    Non-``None`` only when ``expr`` is certainly detached and at least one
    computation feeding it ran with grad disabled (a bare alias of a leaf, a
    leaf made with ``requires_grad=True`` or later ``.requires_grad_()``-ed,
    does not count; neither does a value detached only by ``.detach()``).
    """
    p = provenance(model, expr, at)
    if p.detached and p.no_grad:
        return p.no_grad[0]
    return None


def built_under_enable_grad(model: FileModel, target: Optional[cst.BaseExpression], at: _Located) -> bool:
    """Whether ``target`` is a name whose every binding that may reach
    ``at`` (a backward call, say) ran inside a region that enables grad
    (``torch.enable_grad()``, ``torch.set_grad_enabled(True)``): its graph is
    recorded whatever grad mode the caller runs in, so a backward through it
    works under the caller's ``no_grad`` (catalyst's gradient penalty, whose
    critic runs under ``set_grad_enabled(True)`` "to compute in validation
    mode")."""
    name = dotted_name(target)
    if not name:
        return False
    bindings = model.reaching_bindings(name, at)
    return bool(bindings) and all(
        b.region is not None and b.region.mode is GradMode.ENABLED and b.kind in ("assign", "annassign")
        for b in bindings)


# -- backward targets ------------------------------------------------------------------
def _backward_calls(model: FileModel, scope: Scope):
    """The backwards of ``scope`` that consume their target's graph: backward
    calls and differentiable optimizer steps (``diffopt.step(loss)``)."""
    out = []
    for c in model.calls_in_scope(scope):
        b = backward_call(model, c) or differentiable_step(model, c)
        if b is not None:
            out.append(b)
    return out


def backward_target_names(model: FileModel, scope: Scope) -> set[str]:
    """Dotted names that are directly the target of a backward in ``scope``
    (``loss`` for ``loss.backward()``, ``accelerator.backward(loss)``,
    ``torch.autograd.grad(loss, ...)``)."""
    out = set()
    for b in _backward_calls(model, scope):
        t = dotted_name(b.target)
        if t:
            out.add(t)
    return out


def is_backward_target(model: FileModel, expr: Optional[cst.BaseExpression], at: _Located) -> bool:
    """Whether the name ``expr`` holds, where ``at`` runs, the very value a
    backward in the same scope backpropagates (``loss.backward()`` with the
    same reaching binding of ``loss``): strong evidence of a graph even where
    the grad mode is unknown. A rebinding in between (``loss =
    loss.item()``) breaks it."""
    text = dotted_name(expr)
    if text is None:
        return False
    mine = reaching_binding(model, text, at)
    if mine is None or provenance(model, expr, at).detached:
        return False
    for b in _backward_calls(model, at.scope):
        if dotted_name(b.target) == text and reaching_binding(model, text, b.call) is mine:
            return True
    return False


def freed_by_backward(model: FileModel, expr: Optional[cst.BaseExpression], at: _Located, _depth: int = 0) -> bool:
    """Whether the value the name ``expr`` holds at ``at`` is the target of
    a backward in the same scope that does not retain its graph, or part of
    one by arithmetic (``(loss / accum).backward()``): after it, nothing can
    backpropagate that value again (a second backward raises), so keeping it
    is never needed for a later backward."""
    text = dotted_name(expr)
    if not text:
        return False
    mine = {id(b) for b in model.reaching_bindings(text, at)}
    head = text.split(".")[0]
    owner = {id(b) for b in model.reaching_bindings(head, at)} if "." in text else set()
    for b in _backward_calls(model, at.scope):
        retain = b.retain_graph
        if retain is not None and not is_literal(retain, False):
            continue
        if _flows_into(model, text, mine, _graph_roots(b.target), b.call):
            return True
        if owner and dotted_name(b.target) == text \
                and {id(x) for x in model.reaching_bindings(head, b.call)} == owner:
            return True  # ``train_loss += output.loss`` ... ``accelerator.backward(output.loss)``: the same ``output``
    return _depth < 3 and _backpropagated_by_callee(model, text, at, _depth)


def _backpropagated_by_callee(model: FileModel, text: str, at: _Located, depth: int) -> bool:
    """Whether ``text`` holds, at ``at``, what a same-file helper returned after
    backpropagating it (``loss = step(batch)`` with ``loss.backward()`` then
    ``return loss`` in ``step``): its saved tensors are freed already."""
    if "." in text:
        return False
    b = model.reaching_binding(text, at)
    value = b.value if b is not None and b.kind in ("assign", "annassign") else None
    index = target_element(b, text) if value is not None and b.unpacked else None
    if value is not None and b.unpacked and index is None:
        return False
    fact = call_fact(model, value) if isinstance(value, cst.Call) else None
    callees = model.resolve_callee(fact) if fact is not None else []
    if len(callees) != 1 or callees[0].kind != "function":
        return False
    returned = []  # ``return loss`` (or element ``index`` of ``return loss, overlap, ...``)
    for r in model.returns_of(callees[0]):
        v = r.value
        if index is not None:
            v = v.elements[index].value if isinstance(v, cst.Tuple) and len(v.elements) > index else None
        returned.append((v, r))
    return bool(returned) and all(
        isinstance(v, cst.Name) and freed_by_backward(model, v, r, depth + 1) for v, r in returned)


def _flows_into(model: FileModel, text: str, mine: set[int], roots: list[cst.BaseExpression],
                at: _Located) -> bool:
    """Whether a binding of ``text`` whose id is in ``mine`` is part of the
    graph of ``roots`` (read where ``at`` runs): one of them is ``text``
    with such a binding, or names a value assigned from an expression whose
    graph holds it through differentiable arithmetic (``gen_loss = loss +
    aux``, ``total = total / k``; :func:`_graph_roots`), in the same scope."""
    todo = [(dotted_name(root), at) for root in roots]
    seen: set[int] = set()
    while todo:
        name, where = todo.pop()
        if not name:
            continue
        for binding in model.reaching_bindings(name, where):
            if name == text and id(binding) in mine:
                return True
            if id(binding) in seen or binding.unpacked or binding.value is None \
                    or binding.kind not in ("assign", "annassign", "augassign"):
                continue
            seen.add(id(binding))
            todo.extend((dotted_name(r), binding) for r in _graph_roots(binding.value))
            if binding.kind == "augassign":  # ``x += v``: the previous ``x`` is in the graph too
                todo.append((name, binding))
    return False


def _graph_roots(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    """The named values whose graph ``expr`` extends by differentiable
    arithmetic (``+ - * /``, unary minus) and the forms a backward target
    passes through (:func:`_backward_roots`: ``.sum()``, ``.mean()``,
    ``scaler.scale(x)``, ``d["loss"]``); a name inside any other call is not
    one (``x.detach()``, ``x.item()``, ``f(x)``)."""
    if isinstance(expr, cst.BinaryOperation):
        return _graph_roots(expr.left) + _graph_roots(expr.right)
    if isinstance(expr, cst.UnaryOperation):
        return _graph_roots(expr.expression)
    return _backward_roots(expr)


def backpropagated_names(model: FileModel, scope: Scope) -> set[str]:
    """Dotted names whose values flow into a backward target in ``scope``:
    names read by the target expression, followed through their bindings in
    the scope (``losses`` for ``torch.stack(losses).sum().backward()`` or for
    ``total = sum(losses); total.backward()``)."""
    memo = _cache(model).memo
    key = ("backpropagated", id(scope))
    if key not in memo:
        memo[key] = frozenset(_backpropagated(model, scope))
    return set(memo[key])


def _backpropagated(model: FileModel, scope: Scope) -> set[str]:
    seen: set[str] = set()
    todo: list[str] = []
    for b in _backward_calls(model, scope):
        todo.extend(names_in(b.target))
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for a in model.bindings_of(n, scope):
            if a.value is not None and a.kind != "for":
                todo.extend(names_in(a.value))
    return seen


def returned_names(model: FileModel, scope: Scope) -> set[str]:
    """Dotted names read by ``return``/``yield`` expressions of the function
    ``scope`` (nested functions excluded)."""
    memo = _cache(model).memo
    key = ("returned", id(scope))
    if key not in memo:
        memo[key] = frozenset(_returned(scope))
    return set(memo[key])


def _returned(scope: Scope) -> set[str]:
    node = scope.node
    if not isinstance(node, cst.FunctionDef):
        return set()
    out: set[str] = set()
    stack: list[cst.CSTNode] = [node.body]
    while stack:
        n = stack.pop()
        kind = type(n)
        if kind in _NESTED_SCOPES:
            continue
        if kind in _RESULTS and n.value is not None:  # type: ignore[attr-defined]
            out |= names_in(n.value)  # type: ignore[attr-defined]
            continue
        stack.extend(iter_children(n))
    return out


_NESTED_SCOPES = node_types(cst.FunctionDef, cst.Lambda, cst.ClassDef)
_RESULTS = node_types(cst.Return, cst.Yield)


__all__ = [
    "Provenance", "State", "provenance", "reaching_binding", "is_graph_attached", "computed_under_no_grad",
    "built_under_enable_grad",
    "module_names", "is_module_call", "loss_names", "is_loss_call", "is_scalar_loss", "backward_target_names",
    "is_backward_target", "backpropagated_names", "returned_names", "freed_by_backward", "loss_like",
]
