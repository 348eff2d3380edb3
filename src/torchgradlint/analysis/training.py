"""Training steps: loops whose iterations backpropagate and step an optimizer,
seen through same-file helpers (``train_step(batch)`` called in a loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .model import Call, FileModel, Loop, Scope
from .steps import Backward, OptimizerStep, backward_call, optimizer_step

_MAX_DEPTH = 3


@dataclass(frozen=True)
class StepSite:
    """An optimizer step as seen from a loop: the step call itself, or the
    call of a same-file helper that steps (``via`` is that call)."""

    step: OptimizerStep
    via: Call
    in_helper_loop: bool = False
    """True when, inside the helper chain, the step already runs in a loop
    that backpropagates (that loop is the training loop to judge, not the
    loop around ``via``)."""

    @property
    def order(self) -> int:
        """Pre-order index of the call that sits in the loop."""
        return self.via.order


def _function_steps(model: FileModel, scope: Scope, depth: int) -> list[OptimizerStep]:
    out = []
    for c in model.calls_within(scope.order, scope.end):
        s = optimizer_step(model, c)
        if s is not None:
            out.append(s)
        elif depth < _MAX_DEPTH:
            for callee in model.resolve_callee(c):
                if callee is not scope:
                    out += _function_steps(model, callee, depth + 1)
    return out


def runs_backward(model: FileModel, call: Call, *, accumulating_only: bool, depth: int = 0) -> bool:
    """Whether ``call`` runs a backward, itself or through same-file helpers
    (followed up to ``_MAX_DEPTH`` calls deep). With ``accumulating_only``,
    ``torch.autograd.grad`` does not count (it does not write ``.grad``)."""
    b: Optional[Backward] = backward_call(model, call)
    if b is not None and (b.accumulates or not accumulating_only):
        return True
    if depth >= _MAX_DEPTH:
        return False
    return any(
        runs_backward(model, inner, accumulating_only=accumulating_only, depth=depth + 1)
        for callee in model.resolve_callee(call) if not callee.contains(call.order)
        for inner in model.calls_within(callee.order, callee.end)
    )


def _in_training_loop(model: FileModel, call: Call) -> bool:
    loop = call.loop
    while loop is not None:
        if has_backward(model, loop.order, loop.end):
            return True
        loop = loop.parent
    return False


def _function_step_sites(model: FileModel, scope: Scope, depth: int,
                         seen: frozenset = frozenset()) -> list[tuple[OptimizerStep, bool]]:
    """Steps reached by calling ``scope``, each with whether it runs inside a
    training loop somewhere along the helper chain."""
    out: list[tuple[OptimizerStep, bool]] = []
    seen = seen | {id(scope)}
    for c in model.calls_within(scope.order, scope.end):
        s = optimizer_step(model, c)
        if s is not None:
            out.append((s, _in_training_loop(model, c)))
        elif depth < _MAX_DEPTH:
            for callee in model.resolve_callee(c):
                if id(callee) not in seen:
                    inner = _function_step_sites(model, callee, depth + 1, seen)
                    looped = bool(inner) and _in_training_loop(model, c)
                    out += [(st, flag or looped) for st, flag in inner]
    return out


def step_sites(model: FileModel, order: int, end: int) -> list[StepSite]:
    """Optimizer steps lexically in ``[order, end]`` or reached through a
    same-file helper called there (``in_helper_loop`` marks helper steps that
    already run inside a training loop of the helper chain)."""
    out: list[StepSite] = []
    for c in model.calls_within(order, end):
        s = optimizer_step(model, c)
        if s is not None:
            out.append(StepSite(s, c))
            continue
        for callee in model.resolve_callee(c):
            for inner, looped in _function_step_sites(model, callee, 1):
                out.append(StepSite(inner, c, looped))
    return out


def has_backward(model: FileModel, order: int, end: int) -> bool:
    """Whether ``[order, end]`` runs an accumulating backward, directly or
    through a same-file helper (``torch.autograd.grad`` does not count: it
    does not write ``.grad``)."""
    return any(runs_backward(model, c, accumulating_only=True) for c in model.calls_within(order, end))


def training_loop_of(model: FileModel, site: StepSite) -> Optional[Loop]:
    """The innermost loop around a step site whose body also backpropagates."""
    loop = site.via.loop
    while loop is not None:
        if has_backward(model, loop.order, loop.end):
            return loop
        loop = loop.parent
    return None
