"""Gradients handed from one module to another by reference.

The worker of an asynchronous actor-critic (A3C) backpropagates through a local
copy of a shared model and hands the local gradients to the shared parameters,
which one optimizer over the shared model steps::

    for param, shared_param in zip(model.parameters(), shared_model.parameters()):
        shared_param._grad = param.grad

After this assignment both parameters hold the *same* gradient tensor. Before
PyTorch 2.0, ``optimizer.zero_grad()`` zeroed the shared gradients in place and so
the local ones too; since 2.0 its default ``set_to_none=True`` sets the shared
``.grad`` to ``None`` and leaves the local tensor alone, so the next backward adds
onto it (``torch.optim.Optimizer.zero_grad``:
https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html).
:func:`grad_handoffs` finds these assignments, directly in a span or through a
same-file helper (``ensure_shared_grads(model, shared_model)``), with the modules
on both sides named as the span sees them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from .model import Assign, Call, FileModel, Scope, argument_for
from .names import dotted_name

_MAX_DEPTH = 2
_PARAMETERS = frozenset({"parameters"})
_GRAD_ATTRS = (".grad", "._grad")


@dataclass(frozen=True)
class GradHandoff:
    """``dst_param._grad = src_param.grad`` over ``zip(source.parameters(), target.parameters())``.

    ``order``/``node``: the assignment, or the call of the helper that makes it
    (the place the span shows); ``source``/``target``: the dotted names of the
    module whose gradients are handed over and of the module that receives them,
    as the span spells them (``model``, ``self.shared_model``); ``text``: the
    assignment or helper call as written.
    """

    order: int
    node: cst.CSTNode
    source: str
    target: str
    text: str


def grad_handoffs(model: FileModel, order: int, end: int) -> list[GradHandoff]:
    """Every gradient handoff by reference in ``[order, end]``, made there or
    by a same-file helper called there (followed ``_MAX_DEPTH`` calls deep)."""
    if not model.cached("grad-handoff-assigns", lambda: any(_assigned(model, a) for a in model.assigns)):
        return []  # no handoff anywhere in the file (nearly every file): skip the walk through helpers
    return model.memoised(grad_handoffs, (order, end), lambda: _handoffs(model, order, end, 0))


def _handoffs(model: FileModel, order: int, end: int, depth: int) -> list[GradHandoff]:
    out = [h for a in model.assigns_within(order, end) if (h := _assigned(model, a))]
    if depth < _MAX_DEPTH:
        for call in model.calls_within(order, end):
            for callee in model.resolve_callee(call):
                if callee.contains(call.order):
                    continue
                for inner in _handoffs(model, callee.order, callee.end, depth + 1):
                    source = _as_caller(model, call, callee, inner.source)
                    target = _as_caller(model, call, callee, inner.target)
                    if source and target:
                        out.append(GradHandoff(call.order, call.node, source, target,
                                               model.module.code_for_node(call.node)))
    return sorted(out, key=lambda h: h.order)


def _assigned(model: FileModel, assign: Assign) -> Optional[GradHandoff]:
    """The handoff ``assign`` makes: ``X._grad = Y.grad`` (or ``.grad``/``._grad`` on either side),
    ``X`` and ``Y`` bound by one ``for`` over ``zip(A.parameters(), B.parameters())``."""
    if assign.kind != "assign" or len(assign.targets) != 1 or not isinstance(assign.value, cst.Attribute):
        return None
    dst = assign.targets[0].text or ""
    src = dotted_name(assign.value) or ""
    if assign.targets[0].kind != "attr" or not dst.endswith(_GRAD_ATTRS) or not src.endswith(_GRAD_ATTRS):
        return None
    dst_param, src_param = dst.rpartition(".")[0], src.rpartition(".")[0]
    binding = model.reaching_binding(dst_param, assign)
    if binding is None or binding.kind != "for" or model.reaching_binding(src_param, assign) is not binding:
        return None
    modules = _zipped_modules(binding)
    if modules is None or dst_param not in modules or src_param not in modules:
        return None
    source, target = modules[src_param], modules[dst_param]
    if source == target:
        return None
    return GradHandoff(assign.order, assign.node, source, target, model.module.code_for_node(assign.node).strip())


def _zipped_modules(binding: Assign) -> Optional[dict[str, str]]:
    """For ``for a, b in zip(M.parameters(), N.parameters())``: ``{"a": "M", "b": "N"}``."""
    node = binding.node
    if not isinstance(node, cst.For) or not isinstance(node.target, (cst.Tuple, cst.List)):
        return None
    it = node.iter
    if not isinstance(it, cst.Call) or dotted_name(it.func) != "zip":
        return None
    names = [dotted_name(e.value) for e in node.target.elements]
    if len(names) != len(it.args) or any(a.keyword is not None or a.star for a in it.args):
        return None
    out = {}
    for name, arg in zip(names, it.args):
        value = arg.value
        if isinstance(value, cst.Call) and dotted_name(value.func) == "list" and len(value.args) == 1:
            value = value.args[0].value  # zip(list(m.parameters()), ...)
        if not (isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)
                and value.func.attr.value in _PARAMETERS):
            return None
        receiver = dotted_name(value.func.value)
        if not name or not receiver:
            return None
        out[name] = receiver
    return out


def _as_caller(model: FileModel, call: Call, callee: Scope, text: str) -> Optional[str]:
    """``text`` (a module named inside ``callee``) as ``call``'s site names it:
    a parameter becomes its argument; ``self.x`` stays when the caller is a
    method of the same class called on ``self``; anything else stays."""
    head, _, rest = text.partition(".")
    if head in callee.params and head not in ("self", "cls"):
        arg = argument_for(call, callee, head)
        name = dotted_name(arg) if arg is not None else None
        return f"{name}.{rest}" if name and rest else name
    if head == "self" and not (call.func_text or "").startswith("self."):
        return None
    return text
