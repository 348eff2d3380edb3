"""Mixed-precision facts: gradient scalers and the training-step calls that use them.

A *scaler* is a dotted name bound in the file to a ``GradScaler`` constructor
(``torch.amp.GradScaler``, ``torch.cuda.amp.GradScaler``, FSDP's
``ShardedGradScaler``...), or, when the file does not show its construction
(a parameter, an attribute set elsewhere), a name that ends in ``scaler``
(``scaler``, ``grad_scaler``, ``self.amp_scaler``). :func:`step_events` lists,
in source order, what a function (or script) does with it, seen through
same-file helpers: a scaled backward ``S.scale(loss).backward()``,
``S.unscale_(opt)``, a gradient clip, ``S.step(opt)``, ``S.update()`` and a
plain ``opt.step()``.

PyTorch docs: "Automatic Mixed Precision package - torch.amp" (``GradScaler``:
``scale``, ``unscale_``, ``step``, ``update``, ``get_scale``, ``enabled``),
"CUDA Automatic Mixed Precision examples" ("Working with Unscaled Gradients":
gradient clipping), ``torch.nn.utils.clip_grad_norm_``,
``torch.nn.utils.clip_grad_value_``.
"""

from __future__ import annotations

import bisect

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from .literals import is_literal
from .model import Call, FileModel, Scope
from .names import dotted_name
from .steps import backward_call, optimizer_step
from .torch_api import SCALER_NAME
from .tree import walk

#: qualified names of gradient-scaler classes
SCALER_CLASSES = frozenset({
    "torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.cuda.amp.GradScaler",
    "torch.cuda.amp.grad_scaler.GradScaler", "torch.cpu.amp.GradScaler", "torch.cpu.amp.grad_scaler.GradScaler",
    "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler",
    "torch.distributed.fsdp.ShardedGradScaler",
})

#: gradient-clipping functions and the name of their threshold argument (position 1)
CLIP_FUNCTIONS = {
    "torch.nn.utils.clip_grad_norm_": "max_norm",
    "torch.nn.utils.clip_grad_norm": "max_norm",
    "torch.nn.utils.clip_grad.clip_grad_norm_": "max_norm",
    "torch.nn.utils.clip_grad.clip_grad_norm": "max_norm",
    "torch.nn.utils.clip_grad_value_": "clip_value",
    "torch.nn.utils.clip_grad.clip_grad_value_": "clip_value",
}
_UNSCALE_METHODS = frozenset({"unscale_", "unscale_gradients"})
_MAX_DEPTH = 2
#: event kinds that write gradients
BACKWARD_KINDS = ("scaled_backward", "backward")


def _is_scaler_ctor(model: FileModel, node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, cst.Call) and model.qualname(node.func) in SCALER_CLASSES


def scaler_constructions(model: FileModel) -> dict[str, list[cst.Call]]:
    """Dotted names bound (anywhere in the file) to an expression that builds a
    gradient scaler (``GradScaler(...)``, ``GradScaler() if amp else None``),
    mapped to those constructor calls. Cached per file."""
    def build() -> dict[str, list[cst.Call]]:
        found: dict[str, list[cst.Call]] = {}
        for a in model.assigns:
            if a.value is None or a.kind not in ("assign", "annassign"):
                continue
            ctors = [n for n in walk(a.value) if _is_scaler_ctor(model, n)]
            if ctors:
                for t in a.targets:
                    if t.text:
                        found.setdefault(t.text, []).extend(ctors)  # type: ignore[arg-type]
        return found

    return model.cached("amp-scaler-constructions", build)


def is_scaler(model: FileModel, text: Optional[str]) -> bool:
    """Whether the dotted name ``text`` holds a gradient scaler: bound to a
    scaler constructor in this file, or named like one (``...scaler``)."""
    if not text:
        return False
    return text in scaler_constructions(model) or bool(SCALER_NAME.search(text.rsplit(".", 1)[-1]))


def scaler_disabled(model: FileModel, text: Optional[str]) -> bool:
    """Whether every construction of the scaler ``text`` in this file passes the
    literal ``enabled=False`` (then ``scale`` returns its input unchanged and
    ``step`` is a plain ``optimizer.step()``). ``False`` when no construction is
    seen or the flag is not a literal."""
    ctors = scaler_constructions(model).get(text or "", [])
    if not ctors:
        return False
    for ctor in ctors:
        flag = next((a.value for a in ctor.args if a.keyword is not None and a.keyword.value == "enabled"), None)
        if not is_literal(flag, False):
            return False
    return True


def _scale_call(model: FileModel, node: Optional[cst.BaseExpression], at: Call) -> Optional[str]:
    """The scaler text of ``S.scale(x)`` (or of a name bound to it that reaches ``at``)."""
    if isinstance(node, cst.Name):
        binding = model.reaching_binding(node.value, at)
        node = binding.value if binding is not None and binding.kind in ("assign", "annassign") else None
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "scale":
        text = dotted_name(node.func.value)
        if is_scaler(model, text):
            return text
    return None


def scaled_backward(model: FileModel, call: Call) -> Optional[str]:
    """The scaler text when ``call`` is ``S.scale(loss).backward()`` (or
    ``scaled = S.scale(loss); scaled.backward()``), else ``None``."""
    if call.method != "backward" or call.receiver is None:
        return None
    return _scale_call(model, call.receiver, call)


def clip_threshold(model: FileModel, call: Call) -> Optional[cst.BaseExpression]:
    """The ``max_norm``/``clip_value`` argument of a torch gradient-clipping call, else ``None``."""
    keyword = CLIP_FUNCTIONS.get(call.qualname or "")
    if keyword is None:
        return None
    return call.arg(1, keyword)


def carries_scale(model: FileModel, expr: Optional[cst.BaseExpression], at: Call, depth: int = 0) -> bool:
    """Whether ``expr`` is computed from a scaler's current scale
    (``max_norm * scaler.get_scale()``, or a name bound to such a product)."""
    if expr is None or depth > 2:
        return False
    for n in walk(expr):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value == "get_scale":
            return True
        if isinstance(n, cst.Name):
            binding = model.reaching_binding(n.value, at)
            if binding is not None and binding.value is not None and binding.kind in ("assign", "annassign") \
                    and carries_scale(model, binding.value, at, depth + 1):
                return True
    return False


@dataclass(frozen=True)
class AmpEvent:
    """One AMP-relevant call as seen from a scope.

    ``kind``: ``"scaled_backward"``, ``"backward"`` (any other backward), ``"unscale"``, ``"clip"``, ``"scaler_step"``,
    ``"update"`` or ``"step"`` (a plain ``optimizer.step()``). ``call`` performs
    it (possibly inside a same-file helper); ``site`` is the call in the scope
    walked (``call`` itself, or the helper call that reaches it). ``scaler``
    and ``optimizer`` are dotted texts where they apply.
    """

    kind: str
    call: Call
    site: Call
    scaler: Optional[str] = None
    optimizer: Optional[str] = None

    @property
    def key(self) -> tuple[int, int]:
        """Sort key: where the event happens as seen from the walked scope."""
        return (self.site.order, self.call.order)


def classify(model: FileModel, call: Call) -> Optional[AmpEvent]:
    """The :class:`AmpEvent` of one call (``site`` = ``call``), or ``None``.
    Memoised per file: every scope that reaches a helper classifies its calls."""
    return model.memoised(classify, id(call), lambda: _classify(model, call))


def _classify(model: FileModel, call: Call) -> Optional[AmpEvent]:
    scaler = scaled_backward(model, call)
    if scaler is not None:
        return AmpEvent("scaled_backward", call, call, scaler=scaler)
    if backward_call(model, call) is not None:
        return AmpEvent("backward", call, call)
    if call.method in _UNSCALE_METHODS:
        return AmpEvent("unscale", call, call, scaler=call.receiver_text)
    if clip_threshold(model, call) is not None:
        return AmpEvent("clip", call, call)
    recv = call.receiver_text
    if call.method == "update" and is_scaler(model, recv):
        return AmpEvent("update", call, call, scaler=recv)
    if call.method == "step" and is_scaler(model, recv):
        opt = call.arg(0, "optimizer")
        return AmpEvent("scaler_step", call, call, scaler=recv, optimizer=dotted_name(opt)) if opt is not None \
            else None
    if call.method == "step":
        s = optimizer_step(model, call)
        if s is not None:
            return AmpEvent("step", call, call, optimizer=s.optimizer)
    return None


def step_events(model: FileModel, scope: Scope) -> list[AmpEvent]:
    """AMP events of ``scope``'s own calls (nested defs excluded) in source
    order, with the events of same-file helpers it calls (up to
    ``_MAX_DEPTH`` deep) placed at the helper's call site. Cached per scope."""
    return model.cached(("amp-events", id(scope)), lambda: _events(model, scope, 0, frozenset()))


def _events(model: FileModel, scope: Scope, depth: int, seen: frozenset) -> list[AmpEvent]:
    # per file: every scope that calls a helper asks for its events
    return model.memoised(_events, (id(scope), depth, seen), lambda: _scope_events(model, scope, depth, seen))


def _scope_events(model: FileModel, scope: Scope, depth: int, seen: frozenset) -> list[AmpEvent]:
    out: list[AmpEvent] = []
    seen = seen | {id(scope)}
    for c in model.calls_in_scope(scope):
        ev = classify(model, c)
        if ev is not None:
            out.append(ev)
            continue
        if depth >= _MAX_DEPTH:
            continue
        for callee in model.resolve_callee(c):
            if id(callee) in seen:
                continue
            for inner in _events(model, callee, depth + 1, seen):
                out.append(AmpEvent(inner.kind, inner.call, c, inner.scaler, inner.optimizer))
    return sorted(out, key=lambda e: e.key)


def file_steps_a_scaler(model: FileModel) -> bool:
    """Whether any call of the file is ``S.step(...)`` on a scaler (cheap gate for TGL302)."""
    return model.cached("amp-steps-a-scaler",
                        lambda: any(c.method == "step" and is_scaler(model, c.receiver_text) for c in model.calls))


def file_has_scaled_backward(model: FileModel) -> bool:
    """Whether any call of the file is a scaled backward (cheap gate for the AMP rules)."""
    return model.cached("amp-has-scaled-backward",
                        lambda: any(scaled_backward(model, c) is not None for c in model.calls if c.method == "backward"))


def on_one_path(model: FileModel, a: AmpEvent, b: AmpEvent) -> bool:
    """Whether the two events may run in one pass: they are not in different
    branches of one ``if`` of the walked scope, nor, when both come from the
    same helper call, of one ``if`` of that helper."""
    if a.site is b.site and a.call is not a.site:
        return not model.exclusive(a.call, b.call)
    return not model.exclusive(a.site, b.site)


def latest_backward(model: FileModel, events: list[AmpEvent], at: AmpEvent) -> Optional[AmpEvent]:
    """The last backward (scaled or not) before ``at`` that may run in the same pass.
    ``events`` is sorted by :attr:`AmpEvent.key` (as :func:`step_events` returns them)."""
    memo = model.cached(latest_backward, dict)  # the sort keys of each list asked about, computed once
    entry = memo.get(id(events))
    if entry is None or entry[0] is not events:
        entry = memo[id(events)] = (events, [e.key for e in events])
    for i in range(bisect.bisect_left(entry[1], at.key) - 1, -1, -1):  # the events before ``at``, last first
        e = events[i]
        if e.kind in BACKWARD_KINDS and on_one_path(model, e, at):
            return e
    return None
