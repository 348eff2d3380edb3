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


def _function_backwards(model: FileModel, scope: Scope, depth: int) -> bool:
    for c in model.calls_within(scope.order, scope.end):
        b = backward_call(model, c)
        if b is not None and b.accumulates:
            return True
        if depth < _MAX_DEPTH and any(
            callee is not scope and _function_backwards(model, callee, depth + 1)
            for callee in model.resolve_callee(c)
        ):
            return True
    return False


def step_sites(model: FileModel, order: int, end: int) -> list[StepSite]:
    """Optimizer steps lexically in ``[order, end]`` or reached through a
    same-file helper called there."""
    out: list[StepSite] = []
    for c in model.calls_within(order, end):
        s = optimizer_step(model, c)
        if s is not None:
            out.append(StepSite(s, c))
            continue
        for callee in model.resolve_callee(c):
            for inner in _function_steps(model, callee, 1):
                out.append(StepSite(inner, c))
    return out


def has_backward(model: FileModel, order: int, end: int) -> bool:
    """Whether ``[order, end]`` runs an accumulating backward, directly or
    through a same-file helper (``torch.autograd.grad`` does not count: it
    does not write ``.grad``)."""
    for c in model.calls_within(order, end):
        b: Optional[Backward] = backward_call(model, c)
        if b is not None and b.accumulates:
            return True
        if any(_function_backwards(model, callee, 1) for callee in model.resolve_callee(c)):
            return True
    return False


def training_loop_of(model: FileModel, site: StepSite) -> Optional[Loop]:
    """The innermost loop around a step site whose body also backpropagates."""
    loop = site.via.loop
    while loop is not None:
        if has_backward(model, loop.order, loop.end):
            return loop
        loop = loop.parent
    return None
