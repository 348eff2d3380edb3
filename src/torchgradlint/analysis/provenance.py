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
import re
from dataclasses import dataclass, field
from typing import Optional

import libcst as cst

from . import modes
from .model import Assign, FileModel, GradMode, Region, Scope, _Located, names_in
from .tree import iter_children
from .names import dotted_name
from .steps import backward_call


class State(enum.Enum):
    """Whether an expression holds a graph-attached tensor."""

    ATTACHED = "attached"
    DETACHED = "detached"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Provenance:
    """What is known about one expression's tensor.

    ``state``: attached / detached / unknown.
    ``no_grad``: for a detached value, the grad-mode regions (or decorated
    functions' regions) under which a computation feeding it dropped the
    graph; empty when it was detached by other means.
    ``explicit``: the nodes that detach explicitly (``.item()``, ``.detach()``,
    ``float(x)``, ``.data``).
    ``sources``: graph-producing calls (module or loss calls) feeding it.
    """

    state: State
    no_grad: tuple[Region, ...] = ()
    explicit: tuple[cst.CSTNode, ...] = ()
    sources: tuple[cst.CSTNode, ...] = ()

    @property
    def attached(self) -> bool:
        """``state is ATTACHED``."""
        return self.state is State.ATTACHED

    @property
    def detached(self) -> bool:
        """``state is DETACHED``."""
        return self.state is State.DETACHED


_UNKNOWN = Provenance(State.UNKNOWN)
_CONST = Provenance(State.DETACHED)

# Tensor methods that return a value still in the graph of their receiver.
GRAPH_KEEPING_METHODS = frozenset({
    "mean", "sum", "view", "view_as", "reshape", "reshape_as", "to", "cpu", "cuda", "float", "double", "half",
    "bfloat16", "squeeze", "unsqueeze", "flatten", "abs", "pow", "sqrt", "exp", "log", "clone", "contiguous",
    "norm", "mul", "add", "sub", "div", "neg", "clamp", "permute", "transpose", "t", "expand", "expand_as",
    "repeat", "softmax", "log_softmax", "sigmoid", "tanh", "relu", "matmul", "mm", "bmm", "type", "type_as",
    "select", "narrow", "prod", "std", "var", "square", "logsumexp", "masked_fill", "gather", "index_select",
    "unflatten", "movedim", "sin", "cos", "mul_", "add_", "div_", "sub_",
})
# Methods that may return their receiver unchanged (``x.to(dev)`` when ``x``
# is already there): under no_grad they do not prove a detached result.
MAY_RETURN_SELF = frozenset({"to", "cpu", "cuda", "float", "double", "half", "bfloat16", "type", "type_as",
                             "contiguous", "detach_", "requires_grad_"})
DETACHING_METHODS = frozenset({"item", "tolist", "detach", "numpy"})
DETACHING_BUILTINS = frozenset({"float", "int", "bool", "len", "round", "str"})
TORCH_FACTORIES = frozenset({
    "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm",
    "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like", "rand_like",
    "randn_like", "randint_like", "normal", "bernoulli", "multinomial",
})
TORCH_DIFFERENTIABLE = frozenset({
    "stack", "cat", "concat", "sum", "mean", "matmul", "mm", "bmm", "exp", "log", "sqrt", "abs", "pow", "clamp",
    "tanh", "sigmoid", "relu", "softmax", "log_softmax", "norm", "cdist", "einsum", "where", "maximum", "minimum",
    "square", "flatten", "reshape", "squeeze", "unsqueeze", "add", "mul", "sub", "div", "std", "var",
    "logsumexp", "prod", "dot", "outer", "sin", "cos", "max", "min",
})
FUNCTIONAL_NOT_DIFFERENTIABLE = frozenset({"one_hot"})
LOSS_FUNCTIONALS = frozenset({
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
    "binary_cross_entropy_with_logits", "kl_div", "poisson_nll_loss", "gaussian_nll_loss", "cosine_embedding_loss",
    "hinge_embedding_loss", "margin_ranking_loss", "multi_margin_loss", "multilabel_margin_loss",
    "multilabel_soft_margin_loss", "soft_margin_loss", "triplet_margin_loss", "ctc_loss",
    "triplet_margin_with_distance_loss",
})
_MODULE_NAME = re.compile(
    r"^(model|net|network|encoder|decoder|backbone|generator|discriminator|critic|actor|policy|classifier"
    r"|netG|netD|net_g|net_d)(_?\d+)?$|^\w+_(model|net)$")
_LOSS_NAME = re.compile(r"^(criterion|loss_fn|loss_func|loss_function|lossfn)(_\w+)?$|^\w+_(criterion|loss_fn)$")
_MAX_DEPTH = 12


@dataclass
class _Cache:
    modules: Optional[frozenset[str]] = None
    losses: Optional[dict[str, Assign]] = None
    loss_classes: Optional[frozenset[str]] = None
    memo: dict = field(default_factory=dict)


def _cache(model: FileModel) -> _Cache:
    return model.cached(_Cache, _Cache)


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
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Call):
        return _is_loss_class(model, model.qualname(func.func))
    text = dotted_name(func)
    if not text:
        return False
    qn = model.names.qualify(text) or ""
    if qn.startswith("torch.nn.functional."):
        last = qn.rsplit(".", 1)[-1]
        return last in LOSS_FUNCTIONALS or last.endswith("_loss")
    if text in loss_names(model):
        return True
    return bool(_LOSS_NAME.match(text.rsplit(".", 1)[-1]))


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
    ``nn.Module``: ``model(x)``, ``self.encoder(x)``, ``nn.Linear(2, 2)(x)``."""
    if not isinstance(node, cst.Call):
        return False
    if isinstance(node.func, cst.Call):
        return _is_module_ctor(model, node.func)
    text = dotted_name(node.func)
    if not text:
        return False
    if text in module_names(model):
        return True
    last = text.rsplit(".", 1)[-1]
    head = text.split(".")[0]
    return bool(_MODULE_NAME.match(last)) and (head == "self" or "." not in text)


def _reduction_scalar(node: Optional[cst.BaseExpression]) -> bool:
    if node is None:
        return True
    return isinstance(node, cst.SimpleString) and node.evaluated_value in ("mean", "sum", "batchmean")


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
    binding = reaching_binding(model, text, at)
    if binding is None or binding.kind not in ("assign", "annassign") or binding.unpacked or binding.value is None:
        return False
    return is_scalar_loss(model, binding.value, binding, _depth + 1)


# -- evaluation ---------------------------------------------------------------------
def _combine(parts: list[Provenance]) -> Provenance:
    """Result of a differentiable op over ``parts`` (grad enabled)."""
    if any(p.attached for p in parts):
        return Provenance(State.ATTACHED, sources=tuple(s for p in parts for s in p.sources))
    if parts and all(p.detached for p in parts):
        return Provenance(State.DETACHED, tuple(r for p in parts for r in p.no_grad),
                          tuple(e for p in parts for e in p.explicit))
    if not parts:
        return _CONST
    return _UNKNOWN


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


def _has_requires_grad_kw(call: cst.Call) -> bool:
    return any(a.keyword is not None and a.keyword.value == "requires_grad" and
               not (isinstance(a.value, cst.Name) and a.value.value == "False") for a in call.args)


def _arg_values(call: cst.Call) -> list[cst.BaseExpression]:
    return [a.value for a in call.args if not (a.keyword is not None and a.keyword.value in
                                                  ("dim", "keepdim", "dtype", "device", "reduction", "out"))]


def _requires_grad_later(model: FileModel, text: str, binding: Assign, at: _Located) -> bool:
    """``text.requires_grad_()`` or ``text.requires_grad = ...`` between the
    binding and ``at`` (the leaf then requires grad)."""
    for c in model.calls_in_scope(binding.scope):
        if binding.order < c.order < at.order and c.receiver_text == text and c.method in ("requires_grad_",
                                                                                          "retain_grad"):
            return True
    for a in model.assigns_in_scope(binding.scope):
        if binding.order < a.order < at.order and any(t.text == f"{text}.requires_grad" for t in a.targets):
            return True
    return False


def reaching_binding(model: FileModel, text: str, at: _Located) -> Optional[Assign]:
    """:meth:`FileModel.reaching_binding` (kept as a function for callers of
    this module; ``with`` bodies are seen through by the model itself)."""
    return model.reaching_binding(text, at)


class _Evaluator:
    def __init__(self, model: FileModel) -> None:
        self.m = model
        self.active: set[int] = set()

    def name(self, text: str, at: _Located, depth: int) -> Provenance:
        binding = reaching_binding(self.m, text, at)
        if binding is None or binding.value is None:
            return _UNKNOWN
        if _requires_grad_later(self.m, text, binding, at):
            return Provenance(State.ATTACHED)
        key = id(binding)
        if key in self.active:
            return _UNKNOWN
        self.active.add(key)
        try:
            if binding.kind in ("assign", "annassign", "walrus"):
                p = self.expr(binding.value, binding, depth + 1)
            elif binding.kind == "augassign":
                prev = self.name(text, binding, depth + 1) if binding.op in ("+=", "-=", "*=", "/=") else _UNKNOWN
                cur = self.expr(binding.value, binding, depth + 1)
                p = self._op(binding, [prev, cur])
            else:
                return _UNKNOWN
        finally:
            self.active.discard(key)
        if binding.unpacked and p.attached:
            return _UNKNOWN
        return p

    def _op(self, at: _Located, parts: list[Provenance]) -> Provenance:
        """A new tensor computed from ``parts`` where ``at`` runs."""
        mode = self.m.grad_mode(at)
        if mode is GradMode.DISABLED:
            region = _no_grad_region(self.m, at)
            return Provenance(State.DETACHED, (region,) if region else ())
        if mode is GradMode.ENABLED:
            return _combine(parts)
        if parts and all(p.detached for p in parts):
            return _combine(parts)
        return _UNKNOWN

    def expr(self, node: Optional[cst.BaseExpression], at: _Located, depth: int = 0) -> Provenance:
        if node is None or depth > _MAX_DEPTH:
            return _UNKNOWN
        m = self.m
        if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString, cst.FormattedString,
                             cst.ConcatenatedString, cst.Comparison)):
            return _CONST
        if isinstance(node, cst.Name):
            if node.value in ("True", "False", "None"):
                return _CONST
            return self.name(node.value, at, depth)
        if isinstance(node, cst.Attribute):
            if node.attr.value == "data":
                return Provenance(State.DETACHED, explicit=(node,))
            text = dotted_name(node)
            if text and text.startswith("self."):
                return self.name(text, at, depth) if reaching_binding(m, text, at) else _UNKNOWN
            return _UNKNOWN
        if isinstance(node, cst.BinaryOperation):
            return self._op(at, [self.expr(node.left, at, depth + 1), self.expr(node.right, at, depth + 1)])
        if isinstance(node, cst.UnaryOperation):
            if isinstance(node.operator, cst.Not):
                return _CONST
            return self._op(at, [self.expr(node.expression, at, depth + 1)])
        if isinstance(node, cst.IfExp):
            a, b = self.expr(node.body, at, depth + 1), self.expr(node.orelse, at, depth + 1)
            if a.state is b.state and a.state is not State.UNKNOWN:
                return _combine([a, b])
            return _UNKNOWN
        if isinstance(node, (cst.List, cst.Tuple)):
            parts = [self.expr(e.value, at, depth + 1) for e in node.elements if isinstance(e, cst.Element)]
            if any(p.attached for p in parts):
                return _combine(parts)
            if parts and all(p.detached for p in parts):
                return _combine(parts)
            return _UNKNOWN
        if isinstance(node, cst.Subscript):
            base = self.expr(node.value, at, depth + 1)
            if base.attached and m.grad_mode(at) is GradMode.ENABLED:
                return base
            return _UNKNOWN
        if isinstance(node, cst.Call):
            return self.call(node, at, depth)
        return _UNKNOWN

    def call(self, node: cst.Call, at: _Located, depth: int) -> Provenance:
        m = self.m
        func = node.func
        mode = m.grad_mode(at)
        if isinstance(func, cst.Attribute):
            meth = func.attr.value
            if meth in DETACHING_METHODS:
                return Provenance(State.DETACHED, explicit=(node,))
            if meth == "requires_grad_":
                return Provenance(State.ATTACHED)
        text = dotted_name(func)
        qn = m.names.qualify(text) if text else None
        if text in DETACHING_BUILTINS and qn == text:
            return Provenance(State.DETACHED, explicit=(node,))
        if qn in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            return Provenance(State.ATTACHED)
        if qn and qn.startswith("torch.") and qn.rsplit(".", 1)[-1] in TORCH_FACTORIES and qn.count(".") == 1:
            return Provenance(State.ATTACHED) if _has_requires_grad_kw(node) else _CONST
        if is_loss_call(m, node):
            if mode is GradMode.ENABLED:
                parts = [self.expr(v, at, depth + 1) for v in _arg_values(node)]
                if parts and all(p.detached for p in parts):
                    # a loss with parameters of its own would still be attached
                    return _combine(parts) if _parameter_free_loss(m, node) else _UNKNOWN
                return Provenance(State.ATTACHED, sources=(node,))
            return self._op(at, [])
        if is_module_call(m, node):
            if mode is GradMode.ENABLED:
                return Provenance(State.ATTACHED, sources=(node,))
            return self._op(at, [])
        if isinstance(func, cst.Attribute):
            meth = func.attr.value
            if qn and qn.startswith("torch.") and (text or "").count(".") >= 1 and m.names.qualify(
                    dotted_name(func.value)) in ("torch", "torch.nn.functional"):
                return self._torch_function(qn, node, at, depth)
            if meth in GRAPH_KEEPING_METHODS:
                recv = self.expr(func.value, at, depth + 1)
                if mode is GradMode.DISABLED and meth in MAY_RETURN_SELF:
                    return recv if recv.detached else _UNKNOWN
                if mode is GradMode.DISABLED:
                    return self._op(at, [])
                args = [self.expr(v, at, depth + 1) for v in _arg_values(node)
                        if not isinstance(v, (cst.Name, cst.Attribute, cst.SimpleString))]
                if recv.attached:
                    return recv
                if recv.detached and meth in MAY_RETURN_SELF:
                    return recv
                return self._op(at, [recv, *args]) if recv.state is not State.UNKNOWN else _UNKNOWN
            return _UNKNOWN
        if qn and qn.startswith("torch."):
            return self._torch_function(qn, node, at, depth)
        if text == "sum" and qn == "sum":
            if mode is GradMode.DISABLED:
                return self._op(at, [])
            return self._op(at, [self.expr(v, at, depth + 1) for v in _arg_values(node)])
        return _UNKNOWN

    def _torch_function(self, qn: str, node: cst.Call, at: _Located, depth: int) -> Provenance:
        last = qn.rsplit(".", 1)[-1]
        functional = qn.startswith("torch.nn.functional.")
        if not ((qn.count(".") == 1 and last in TORCH_DIFFERENTIABLE)
                or (functional and last not in FUNCTIONAL_NOT_DIFFERENTIABLE)):
            return _UNKNOWN
        if self.m.grad_mode(at) is GradMode.DISABLED:
            return self._op(at, [])
        return self._op(at, [self.expr(v, at, depth + 1) for v in _arg_values(node)])


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


# -- backward targets ------------------------------------------------------------------
def _backward_calls(model: FileModel, scope: Scope):
    out = []
    for c in model.calls_in_scope(scope):
        b = backward_call(model, c)
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
        if isinstance(n, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        if isinstance(n, (cst.Return, cst.Yield)) and n.value is not None:
            out |= names_in(n.value)
            continue
        stack.extend(iter_children(n))
    return out


__all__ = [
    "Provenance", "State", "provenance", "reaching_binding", "is_graph_attached", "computed_under_no_grad",
    "module_names", "is_module_call", "loss_names", "is_loss_call", "is_scalar_loss", "backward_target_names",
    "is_backward_target", "backpropagated_names", "returned_names",
]
