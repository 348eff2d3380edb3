"""TGL004 clip-grad-misordered."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ..analysis.literals import is_infinite, is_literal, number
from ..analysis.model import Call, FileModel, Scope
from ..analysis.steps import foreign_framework_file
from ..analysis.training import runs_backward, step_sites
from ..registry import Finding, Rule

#: gradient clipping calls (``torch.nn.utils.*``, and the same-named methods of
#: accelerate's ``Accelerator`` and FSDP): by the callee's last name component
CLIP_FUNCTIONS = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"})
#: a literal cap at or above this (or ``inf``) clips nothing: the call only measures the norm
_NO_CAP = 1e6
#: frameworks with a same-named clipping function of other semantics (``mlx.optimizers.clip_grad_norm``
#: returns clipped copies; ``paddle.nn.utils.clip_grad_norm_``)
_FOREIGN = frozenset({"mlx", "jax", "flax", "optax", "paddle", "mindspore", "oneflow", "mxnet", "tensorflow", "keras"})


def clip_call(model: FileModel, call: Call) -> bool:
    """Whether ``call`` clips gradients in place (``clip_grad_norm_``,
    ``clip_grad_value_``, the deprecated ``clip_grad_norm``), however imported,
    and caps them (a ``max_norm`` of ``inf`` only measures the norm)."""
    last = (call.qualname or call.func_text or "").rsplit(".", 1)[-1]
    if last not in CLIP_FUNCTIONS or (call.qualname or "").split(".")[0] in _FOREIGN:
        return False
    if any(a.keyword is not None and "clip" in a.keyword.value and is_literal(a.value, False)
           for a in call.node.args):
        return False  # a wrapper told not to clip (``clip_grad=False``): it only measures the norm
    cap = call.arg(1, "clip_value" if last == "clip_grad_value_" else "max_norm")
    return not _unbounded(model, cap)


def _unbounded(model: FileModel, node: Optional[cst.BaseExpression]) -> bool:
    """An infinity (:func:`~torchgradlint.analysis.literals.is_infinite`) or a number literal >= 1e6."""
    value = number(node)
    return value >= _NO_CAP if value is not None else is_infinite(model, node)


def _lightning_class(model: FileModel, scope: Scope) -> bool:
    """Whether ``scope`` is a method of a same-file class deriving from a
    Lightning ``LightningModule`` (resolved through imports)."""
    info = model.classes.get(scope.class_name or "")
    return info is not None and any(b.endswith("LightningModule") for b in info.bases)


def _manual_optimization(model: FileModel, scope: Scope) -> bool:
    """Whether the Lightning module of ``scope`` optimizes by hand
    (``self.automatic_optimization = False`` or ``self.manual_backward``)."""
    for a in model.assigns:
        if a.binds("self.automatic_optimization") and a.scope.class_name == scope.class_name:
            return True
    return any(c.method == "manual_backward" and c.scope.class_name == scope.class_name for c in model.calls)


class ClipGradMisordered(Rule):
    """Gradient clipping that runs where it cannot affect an optimizer step.

    Rests on: ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` (they
    rescale the ``.grad`` present when called, in place), ``torch.Tensor.backward``
    (it writes ``.grad``), ``torch.optim.Optimizer.step`` (it applies the
    ``.grad`` present when called) and Lightning's "Gradient clipping"
    (``Trainer(gradient_clip_val=...)``; ``training_step`` runs before
    the backward).
    """

    code = "TGL004"
    name = "clip-grad-misordered"
    summary = "gradient clipping after `step()` or before `backward()` clips nothing the optimizer uses"
    probe = "clip-effect"
    prefilter = (("clip_grad",),)
    docs = """
## What it does
Checks for `clip_grad_norm_` / `clip_grad_value_` calls (torch's, however
imported, and the same-named methods of accelerate and FSDP) placed where
they cannot change an update, judged in program order over one iteration of
the training loop (or one call of a training-step function):

- after the optimizer step, with no backward between the step and the clip
  and no later step before the next iteration's backward;
- before the iteration's first backward, with a step after that backward and
  none between the clip and the backward;
- inside `training_step` of a `LightningModule` with automatic optimization:
  Lightning runs the backward after `training_step` returns.

It stays silent on `backward → [scaler.unscale_] → clip → step`, on a clip
before the step of a deferred loop (`clip → step → zero_grad → backward`), on
`max_norm=float('inf')` (or any cap >= 1e6: the call only measures the norm),
on a wrapper told not to clip (`clip_grad=False`), on LBFGS closures, on `configure_gradient_clipping` and
`on_before_optimizer_step`, and on Lightning modules that optimize by hand.

## Why is this bad?
Clipping rescales the `.grad` tensors present when it runs. After `step()`
the update already used the unclipped gradients, and the clipped ones are
reset before the next backward; before `backward()` the gradients are `None`
or zero (the call returns a norm of 0.0) and the backward then writes
unclipped ones. Either way the cap never applies, silently: measured (torch
2.13, CPU, targets x50, `max_norm=1`, SGD lr 0.01) the applied gradient norms
ran 153.7, 265.1, 769.0, 3337 and the parameters became non-finite at step 7,
exactly as without clipping; the correct order held them at 1.00
(awslabs/graphstorm #1366 "--max-grad-norm silently does nothing",
jongwook/onsets-and-frames #24, Cranial-XIX/FAMO #4).

## Example
```python
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
```

## Use instead
```python
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
    optimizer.step()
```

## References
- [torch.nn.utils.clip_grad_norm_](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_norm_.html)
- [torch.nn.utils.clip_grad_value_](https://pytorch.org/docs/stable/generated/torch.nn.utils.clip_grad_value_.html)
- [torch.optim.Optimizer.step](https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.step.html)
- [Lightning: gradient clipping](https://lightning.ai/docs/pytorch/stable/advanced/training_tricks.html#gradient-clipping)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        if foreign_framework_file(model):
            return
        for call in model.calls:
            if not clip_call(model, call):
                continue
            fn = model.enclosing_function(call.scope)
            if fn is not None and fn.name == "training_step" and _lightning_class(model, fn) \
                    and not _manual_optimization(model, fn):
                yield Finding(call.node, f"`{call.func_text}()` in a LightningModule's `training_step` runs "
                                         "before the backward",
                              detail="Lightning backpropagates the returned loss after `training_step` "
                                     "returns, so the clip sees no gradients of this step; use "
                                     "`Trainer(gradient_clip_val=...)` or `configure_gradient_clipping`.")
                continue
            message = self._misorder(model, call)
            if message is not None:
                yield Finding(call.node, message[0], detail=message[1])

    @staticmethod
    def _misorder(model: FileModel, clip: Call) -> Optional[tuple[str, str]]:
        """Judge ``clip`` over one iteration: the innermost loop around it that
        backpropagates, else its function's body."""
        span = None
        for loop in reversed(clip.loops):
            if any(runs_backward(model, c, accumulating_only=True)
                   for c in model.calls_within(loop.order, loop.end) if c.scope is clip.scope):
                span = (loop.order, loop.end)
                break
        if span is None:
            fn = model.enclosing_function(clip.scope)
            if fn is None:
                return None
            span = (fn.order, fn.end)
        calls = [c for c in model.calls_within(*span) if c.scope is clip.scope and not model.exclusive(c, clip)]
        backwards = [c.order for c in calls if runs_backward(model, c, accumulating_only=True)]
        steps = [s.via.order for s in step_sites(model, *span)
                 if s.via.scope is clip.scope and not model.exclusive(s.via, clip)]
        if not backwards or not steps:
            return None
        first_backward = min(backwards)
        if any(s > clip.order for s in steps) or any(s < first_backward for s in steps):
            after_step = False
        else:
            last_step = max(s for s in steps if s < clip.order)
            after_step = not any(last_step < b < clip.order for b in backwards)
        if after_step:
            return (f"`{clip.func_text}()` runs after the optimizer step",
                    "The step already applied the unclipped gradients and they are reset before the next "
                    "backward, so the clip changes nothing; clip between `backward()` and `step()`.")
        if clip.order < first_backward and any(s > first_backward for s in steps) \
                and not any(clip.order < s < first_backward for s in steps):
            return (f"`{clip.func_text}()` runs before this iteration's `backward()`",
                    "It rescales gradients that the backward then overwrites or adds to, so the step applies "
                    "unclipped gradients; clip between `backward()` and `step()`.")
        return None
