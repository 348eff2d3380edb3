"""TGL301 amp-clip-without-unscale."""

from __future__ import annotations

from typing import Iterator

from ..analysis.amp_facts import (carries_scale, clip_threshold, file_has_scaled_backward, latest_backward,
                                  scaler_disabled, step_events)
from ..analysis.literals import is_infinite
from ..analysis.model import FileModel
from ..analysis.steps import foreign_framework_file
from ..registry import Finding, Rule


class AmpClipWithoutUnscale(Rule):
    """Gradient clipping on gradients a ``GradScaler`` has scaled, with no ``unscale_`` first.

    Rests on: "Automatic Mixed Precision package - torch.amp" (``GradScaler.scale``,
    ``GradScaler.unscale_``: "unscale_ should only be called once per optimizer per step call,
    and only after all gradients for that optimizer's assigned parameters have been
    accumulated"), "CUDA Automatic Mixed Precision examples" section "Working with Unscaled
    Gradients - Gradient clipping", and ``torch.nn.utils.clip_grad_norm_`` /
    ``clip_grad_value_``.
    """

    code = "TGL301"
    name = "amp-clip-without-unscale"
    summary = "gradient clipping after `scaler.scale(loss).backward()` with no `scaler.unscale_(optimizer)` first"
    probe = "amp-clip-scale"
    prefilter = (("scale",), ("clip_grad",))
    needs_backward = True
    docs = """
## What it does
Checks for `torch.nn.utils.clip_grad_norm_` or `clip_grad_value_` called
after a scaled backward, `scaler.scale(loss).backward()`, with no
`scaler.unscale_(optimizer)` between the two: in the same function or
script, or in same-file helpers it calls (`self.clip_gradients()`).

It stays silent when `unscale_` runs first (also under an accumulation
gate), on `accelerator.clip_grad_norm_` (Accelerate unscales for you), when
the threshold is multiplied by `scaler.get_scale()`, on a clip that never
clips (`max_norm=float("inf")`, for logging), on a clip in the `else`
branch of the AMP `if`, and when the scaler is built with the literal
`enabled=False`.

## Why is this bad?
`scaler.scale(loss)` multiplies the loss by the scale (65536 at the start),
so every gradient is 65536 times too large until `unscale_` (or
`scaler.step`) divides it back. A clip in between compares the scaled norm
with `max_norm`, so it always clips, and after `scaler.step` unscales, the
update has norm `max_norm / 65536`. Measured on CPU (torch 2.13,
`GradScaler("cpu")`): with `max_norm=1.0` the applied gradient norm was
1.53e-5 instead of 1.0, and training all but stopped.
pytorch/examples#1196 (minGPT-ddp), Pytorch-UNet#468 and EveryDream2trainer
PR#175 ("effectively halting training") fixed exactly this.

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
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)
    scaler.update()
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
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    scaler.step(optimizer)
    scaler.update()
```

`scaler.step(optimizer)` knows that `unscale_` already ran and does not
unscale twice.

## References
- [Automatic Mixed Precision package - torch.amp (GradScaler)](https://pytorch.org/docs/stable/amp.html#gradient-scaling)
- [CUDA Automatic Mixed Precision examples: Working with Unscaled Gradients](https://pytorch.org/docs/stable/notes/amp_examples.html#working-with-unscaled-gradients)
- [torch.nn.utils.clip_grad_norm_](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        if not file_has_scaled_backward(model) or foreign_framework_file(model):
            return
        reported: set[int] = set()
        for scope in model.scopes:
            if scope.kind not in ("module", "function"):
                continue
            events = step_events(model, scope)
            if not any(e.kind == "scaled_backward" for e in events):
                continue
            for clip in events:
                if clip.kind != "clip" or id(clip.call.node) in reported:
                    continue
                back = latest_backward(model, events, clip)
                if back is None or back.kind != "scaled_backward" or scaler_disabled(model, back.scaler):
                    continue
                if any(e.kind == "unscale" and back.key < e.key < clip.key for e in events):
                    continue
                threshold = clip_threshold(model, clip.call)
                if carries_scale(model, threshold, clip.call) or is_infinite(model, threshold):
                    continue
                reported.add(id(clip.call.node))
                fn = (clip.call.func_text or "clip_grad_norm_").rsplit(".", 1)[-1]
                scaler = back.scaler or "scaler"
                yield Finding(
                    clip.call.node,
                    f"`{fn}` clips gradients scaled by `{scaler}.scale(...)` with no `{scaler}.unscale_` first",
                    detail=(f"The gradients are still multiplied by the loss scale (65536 at the start), so the "
                            f"threshold applies to scaled gradients and, once `{scaler}.step` unscales them, the "
                            f"update is clipped to threshold/scale (measured: applied norm 1.53e-5 for "
                            f"max_norm=1.0); call `{scaler}.unscale_(optimizer)` before clipping."))
