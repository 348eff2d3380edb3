"""Function summaries: what calling a same-file function does to the caller.

- :func:`leaves_grad_disabled`: the function switches grad mode off with a
  bare ``torch.set_grad_enabled(False)`` (or ``torch.no_grad().__enter__()``)
  and returns without switching it back, so the caller goes on with grad
  disabled;
- :func:`reached_from_forward`: methods that ``nn.Module.forward`` runs
  (itself and the ``self.<method>()`` helpers it calls), which run under
  whatever grad mode the module's callers chose (evaluation runs them under
  ``no_grad``);
- :func:`parameter_attributes`: ``self.<name>`` attributes bound to
  ``nn.Parameter(...)`` in a class;
- :func:`trainable_evidence`: a module class that offers to make its own
  parameters trainable (an ``unfreeze`` option, ``requires_grad_(True)``).

Return-value provenance of same-file functions (parameters bound to the
caller's arguments, tuples element-wise) lives in :mod:`.provenance`, and
"resets gradients" / "trains module M" / "puts M in eval" in :mod:`.steps`
and :mod:`.modes`.

PyTorch docs: ``torch.set_grad_enabled`` ("can be used as a context-manager
or as a function"), ``torch.is_grad_enabled``, ``torch.nn.Module.forward``.
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from . import modes
from .literals import is_literal
from .model import FileModel, GradMode, Region, Scope
from .names import dotted_name

_GRAD_CHECKS = frozenset({"torch.is_grad_enabled", "torch.is_inference_mode_enabled"})


def leaves_grad_disabled(model: FileModel, scope: Scope) -> Optional[Region]:
    """The bare grad-disabling statement in the body of the function
    ``scope`` that is still in force when the function returns, or
    ``None``. A later bare ``set_grad_enabled(True)``/``(flag)`` in the
    body, or a ``try``/``finally`` restore, cancels it."""
    if scope.kind != "function":
        return None
    key = ("leaves-grad-disabled", id(scope))
    if key in model.memo:
        return model.memo[key]  # type: ignore[return-value]
    found: Optional[Region] = None
    body = getattr(scope.node, "body", None)
    for region in model.regions:
        if region.kind != "statement" or not scope.contains(region.order):
            continue
        if model.enclosing_function(_scope_at(model, region.order) or scope) is not scope:
            continue
        if region.mode is GradMode.DISABLED and _top_level(body, region.node):
            found = region
        elif region.mode is not GradMode.DISABLED:
            found = None  # switched back (or to an unknown flag) later in the body
    for call in model.calls_within(scope.order, scope.end):
        if call.method == "__enter__" and isinstance(call.receiver, cst.Call) and call.scope is scope \
                and model.qualname(call.receiver.func) == "torch.no_grad":
            # (``torch.inference_mode().__enter__()`` holds its guard in the temporary object,
            # released at the end of the statement: it leaves nothing disabled; see TGL005)
            if not any(c.method == "__exit__" and c.scope is scope for c in model.calls_within(scope.order, scope.end)):
                found = found or Region(call.node, GradMode.DISABLED, "statement",
                                        "torch.no_grad", call.order)
    model.memo[key] = found
    return found


def _scope_at(model: FileModel, order: int) -> Optional[Scope]:
    inner = None
    for s in model.scopes:
        if s.contains(order) and (inner is None or s.order >= inner.order):
            inner = s
    return inner


def _top_level(body: Optional[cst.CSTNode], node: cst.CSTNode) -> bool:
    """Whether the statement ``node`` sits directly in ``body`` (not in a branch)."""
    for stmt in getattr(body, "body", ()):
        if isinstance(stmt, cst.SimpleStatementLine) and any(s is node for s in stmt.body):
            return True
    return False


def reached_from_forward(model: FileModel, scope: Scope) -> Optional[Scope]:
    """The ``forward`` of a torch module class that runs ``scope`` (``scope``
    itself or a method it reaches through ``self.<method>()`` calls, two
    levels deep), or ``None``."""
    fn = model.enclosing_function(scope)
    if fn is None or fn.class_name is None or fn.class_name not in modes.module_classes(model):
        return None
    frontier = [fn]
    for _ in range(3):
        nxt = []
        for f in frontier:
            if f.name == "forward":
                return f
            for site in model.callers_of(f):
                caller = model.enclosing_function(site.scope)
                if caller is not None and caller.class_name == fn.class_name and caller is not f:
                    nxt.append(caller)
        frontier = nxt
    return None


def checks_grad_mode(model: FileModel, scope: Scope) -> bool:
    """Whether the function reads the grad mode or the module mode
    (``torch.is_grad_enabled()``, ``self.training``) to decide what to run."""
    for call in model.calls_within(scope.order, scope.end):
        if call.qualname in _GRAD_CHECKS:
            return True
    code = model.module.code_for_node(scope.node)
    return "self.training" in code or "is_grad_enabled" in code


def parameter_attributes(model: FileModel, class_name: str) -> set[str]:
    """``self.<name>`` attributes that a class binds to ``nn.Parameter(...)``."""
    info = model.classes.get(class_name)
    if info is None:
        return set()
    out: set[str] = set()
    for method in info.methods.values():
        for a in model.assigns_in_scope(method):
            if a.kind in ("assign", "annassign") and isinstance(a.value, cst.Call) \
                    and model.qualname(a.value.func) in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
                out.update(t.text for t in a.targets if t.text and t.text.startswith("self."))
    return out


def attribute_reads(model: FileModel, scope: Scope, text: str) -> list[cst.CSTNode]:
    """Nodes reading the dotted name ``text`` inside the function ``scope``."""
    from .tree import walk

    return [n for n in walk(scope.node) if isinstance(n, cst.Attribute) and dotted_name(n) == text]


_UNFREEZE = re.compile(r"un_?freez", re.IGNORECASE)


def trainable_evidence(model: FileModel, class_name: str) -> Optional[cst.CSTNode]:
    """A node in the same-file class ``class_name``, outside its ``forward``,
    showing that the class is meant to be trainable on demand, or ``None``:
    a name, attribute or string naming an *unfreeze* option
    (``getattr(args, 'unfreeze_mm_vision_tower', False)``, ``self.unfreeze``),
    ``requires_grad_()``/``requires_grad_(True)`` or ``.requires_grad = True``.
    (A ``requires_grad_(False)`` freeze is no evidence.)"""
    from .tree import children

    info = model.classes.get(class_name)
    if info is None:
        return None
    forward = info.methods.get("forward")
    skip = forward.node if forward is not None else None
    stack: list[cst.CSTNode] = [info.node]
    while stack:
        node = stack.pop()
        if node is skip:
            continue
        if isinstance(node, cst.Name) and _UNFREEZE.search(node.value):
            return node
        if isinstance(node, cst.SimpleString) and _UNFREEZE.search(node.value):
            return node
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value == "requires_grad_" \
                and (not node.args or is_literal(node.args[0].value, True)):
            return node
        if isinstance(node, cst.Assign) and is_literal(node.value, True) \
                and any(isinstance(t.target, cst.Attribute) and t.target.attr.value == "requires_grad"
                        for t in node.targets):
            return node
        stack.extend(reversed(children(node)))
    return None
