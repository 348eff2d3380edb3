"""TGL302 amp-scaler-bypassed."""

from __future__ import annotations

from typing import Iterator, Optional

from ..analysis.amp_facts import (BACKWARD_KINDS, AmpEvent, file_has_scaled_backward, file_steps_a_scaler,
                                  latest_backward, on_one_path, scaler_disabled, step_events)
from ..analysis.model import FileModel, Loop
from ..analysis.steps import foreign_framework_file
from ..registry import Finding, Rule


class AmpScalerBypassed(Rule):
    """A ``GradScaler`` whose scaled gradients reach ``optimizer.step()`` directly, or whose
    ``step`` runs again without ``update``.

    Rests on: "Automatic Mixed Precision package - torch.amp" (``GradScaler.step``: "unscales
    the gradients ... if no inf/NaN gradients are found, invokes optimizer.step() using the
    unscaled gradients. Otherwise, optimizer.step() is skipped"; ``GradScaler.update``: "should
    only be called at the end of the iteration, after scaler.step(optimizer) has been invoked
    for all optimizers used this iteration") and "CUDA Automatic Mixed Precision examples"
    (typical mixed precision training).
    """

    code = "TGL302"
    name = "amp-scaler-bypassed"
    summary = "`scaler.scale(loss).backward()` then `optimizer.step()`, or `scaler.step()` in a loop with no `scaler.update()`"
    probe = "amp-scaler-bypass"
    prefilter = (("scale",), ("step",))
    ast_prefilter = "grad-scaler"  # a GradScaler built, or `.scale`/`.step` on a `*scaler`
    docs = """
## What it does
Checks two misuses of a `GradScaler` `S`:

- a scaled backward, `S.scale(loss).backward()`, followed on the same path
  (same function or script, or same-file helpers it calls) by a plain
  `optimizer.step()` instead of `S.step(optimizer)`, with or without
  `S.unscale_(optimizer)` first;
- `S.step(optimizer)` inside a training loop (a loop that backpropagates)
  with no `S.update()` anywhere in that loop.

It stays silent when `S.step(optimizer)` and `S.update()` run in the same
branch, when the plain `optimizer.step()` is the non-AMP alternative of an
`if` that calls `S.step` in its other branch (or the same optimizer is
stepped by `S.step` elsewhere on the path), when an unscaled backward runs
between the scaled one and the plain step, when several optimizers are
stepped by `S.step` in an inner loop and `S.update()` follows in the
training loop, and when the scaler is built with the literal
`enabled=False`.

## Why is this bad?
`S.scale(loss)` multiplies the loss, and so every gradient, by the scale
(65536 at the start). Only `S.step(optimizer)` divides the gradients back
before stepping, and skips the step when they hold inf/NaN. A plain
`optimizer.step()` applies gradients 65536 times too large: measured on CPU
(torch 2.13), the first update had norm 1,025,620 instead of 15.6 and the
parameters became NaN. After `S.unscale_(optimizer)` the gradients are right
but a plain step applies the inf/NaN gradients the scaler exists to skip
(the scale still halves in `update()`, the parameters are already
non-finite). `S.step()` without `S.update()` raises `step() has already been
called since the last update()` at the second iteration, and `update()` after
a plain step raises `No inf checks were recorded prior to update`.
nerfstudio-project/nerfacc#307 ("gradients are now 1024x larger") is this bug.

## Example
```python
import torch

model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    optimizer.step()
```

## Use instead
```python
import torch

model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cuda")
for x, y in loader:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = torch.nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
```

## References
- [Automatic Mixed Precision package - torch.amp (GradScaler)](https://pytorch.org/docs/stable/amp.html#gradient-scaling)
- [CUDA Automatic Mixed Precision examples: Typical Mixed Precision Training](https://pytorch.org/docs/stable/notes/amp_examples.html#typical-mixed-precision-training)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        if foreign_framework_file(model) or not (file_has_scaled_backward(model) or file_steps_a_scaler(model)):
            return
        reported: set[int] = set()
        for scope in model.scopes:
            if scope.kind not in ("module", "function"):
                continue
            events = step_events(model, scope)
            if not any(e.kind in ("scaled_backward", "scaler_step") for e in events):
                continue
            for finding in (*self._plain_steps(model, events), *self._steps_without_update(model, events)):
                if id(finding.node) not in reported:
                    reported.add(id(finding.node))
                    yield finding

    @staticmethod
    def _plain_steps(model: FileModel, events: list[AmpEvent]) -> Iterator[Finding]:
        """A plain ``opt.step()`` whose latest preceding backward on its path is a scaled one."""
        for step in events:
            if step.kind != "step":
                continue
            back = latest_backward(model, events, step)
            if back is None or back.kind != "scaled_backward" or scaler_disabled(model, back.scaler):
                continue
            if any(e.kind == "scaler_step" and (e.optimizer == step.optimizer or not on_one_path(model, e, step))
                   for e in events):
                continue
            scaler = back.scaler or "scaler"
            opt = step.optimizer or "optimizer"
            unscaled = any(e.kind == "unscale" and back.key < e.key < step.key for e in events)
            if unscaled:
                message = f"`{opt}.step()` after `{scaler}.unscale_`: the scaler's inf/NaN check is bypassed"
                detail = (f"A plain step applies gradients that hold inf/NaN (which `{scaler}.step` would skip) and "
                          f"the parameters become non-finite; call `{scaler}.step({opt})` then `{scaler}.update()`.")
            else:
                message = f"`{opt}.step()` applies gradients scaled by `{scaler}.scale(...)`"
                detail = (f"The gradients are still multiplied by the loss scale (65536 at the start): measured, an "
                          f"update 65536x too large and NaN parameters; call `{scaler}.step({opt})` then "
                          f"`{scaler}.update()`.")
            yield Finding(step.call.node, message, detail=detail)

    @staticmethod
    def _steps_without_update(model: FileModel, events: list[AmpEvent]) -> Iterator[Finding]:
        """``S.step(opt)`` in a training loop with no ``S.update()`` anywhere in that loop."""
        for step in events:
            if step.kind != "scaler_step" or scaler_disabled(model, step.scaler):
                continue
            loop = _training_loop(step, events)
            if loop is None:
                continue
            if any(e.kind == "update" and loop.contains(e.site.order) for e in events):
                continue
            scaler = step.scaler or "scaler"
            yield Finding(step.call.node, f"`{scaler}.step()` in a training loop that never calls `{scaler}.update()`",
                          detail=("The second iteration raises `step() has already been called since the last "
                                  "update()`, and the scale never adapts; call "
                                  f"`{scaler}.update()` after the last `{scaler}.step(...)` of each iteration."))


def _training_loop(step: AmpEvent, events: list[AmpEvent]) -> Optional[Loop]:
    """The innermost loop around ``step``'s site whose body backpropagates (a loop over
    optimizers, ``for opt in optimizers: scaler.step(opt)``, is not one)."""
    for loop in reversed(step.site.loops):
        if any(e.kind in BACKWARD_KINDS and loop.contains(e.site.order) for e in events):
            return loop
    return None
