"""TGL002 backward-under-no-grad."""

from __future__ import annotations

from typing import Iterator, Optional

from ..analysis.model import Assign, Call, FileModel, GradMode, Region, names_in
from ..analysis.provenance import computed_under_no_grad, provenance
from ..analysis.steps import backward_call, is_true
from ..registry import Finding, Rule


def _region_text(model: FileModel, region: Region) -> str:
    api = region.api or "torch.no_grad"
    if region.kind == "decorator":
        return f"`@{api}` on the enclosing function"
    if region.kind == "statement":
        return f"`{api}(False)`"
    return f"`with {api}()`"


class BackwardUnderNoGrad(Rule):
    """Backward through a tensor whose forward ran with grad disabled.

    Rests on: "Locally disabling gradient computation" (autograd notes),
    ``torch.no_grad`` ("the result of every computation will have
    requires_grad=False"), ``torch.inference_mode``, ``torch.autograd.grad``
    (``create_graph``).
    """

    code = "TGL002"
    name = "backward-under-no-grad"
    summary = "backward on a tensor computed under no_grad, or create_graph=True under no_grad"
    prefilter = (("backward", "grad"), ("no_grad", "inference_mode", "set_grad_enabled"))
    # check(): every finding is at a backward call (analysis.steps.backward_call).
    needs_backward = True
    docs = """
## What it does
Checks for `backward()`, `torch.autograd.backward`, `torch.autograd.grad` and
`accelerator.backward` on a tensor whose forward pass ran inside a
`torch.no_grad()` / `torch.inference_mode()` region (the same region, an
enclosing one, a `@torch.no_grad()` / `@torch.inference_mode()` decorated
function, or after `torch.set_grad_enabled(False)`), and for
`torch.autograd.grad(..., create_graph=True)` called with grad disabled when
its gradients are used (a penalty computed) in that region.

## Why is this bad?
With grad disabled autograd records nothing: every result has
`requires_grad=False` and no `grad_fn`, so `backward()` raises
`RuntimeError: element 0 of tensors does not require grad and does not have a
grad_fn`. A gradient penalty written as
`torch.autograd.grad(..., create_graph=True)` inside `no_grad`, with the
penalty computed in the same region, has no graph: it adds a constant to the
loss and contributes no gradient. Training runs, the regulariser silently does
nothing.

Computing the loss outside the region and calling `backward()` inside it works
and is not flagged, nor is a forward and backward inside `torch.enable_grad()`
nested in `no_grad`. `set_grad_enabled(flag)` with a non-literal flag is never
a finding.

## Example
```python
with torch.no_grad():
    loss = criterion(model(x), y)
    loss.backward()
```

## Use instead
```python
loss = criterion(model(x), y)
loss.backward()
with torch.no_grad():
    ...  # metrics, parameter updates
```

## References
- [Locally disabling gradient computation](https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation)
- [torch.no_grad](https://pytorch.org/docs/stable/generated/torch.no_grad.html)
- [torch.inference_mode](https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html)
- [torch.autograd.grad](https://pytorch.org/docs/stable/generated/torch.autograd.grad.html)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        if not model.regions and not any(s.decorator_region for s in model.scopes):
            return
        for call in model.calls:
            b = backward_call(model, call)
            if b is None or b.target is None:
                continue
            graph = provenance(model, b.target, call)
            if graph.inference and not graph.detached:
                yield Finding.from_text(call.node, (
                    f"{_short(model, b.target)} depends on a tensor created under `torch.inference_mode()`; "
                    "autograd cannot save inference tensors for backward, so this raises \"Inference tensors "
                    "cannot be saved for backward\"; create it under `torch.no_grad()` instead (or `.clone()` "
                    "it outside inference mode)"))
                continue
            region = computed_under_no_grad(model, b.target, call)
            target = model.module.code_for_node(b.target)
            if len(target) > 40:
                target = "the tensor"
            else:
                target = f"`{target}`"
            if region is not None:
                yield Finding.from_text(call.node, (
                    f"{target} was computed under {_region_text(model, region)}, so it has no `grad_fn` and "
                    "backward raises \"element 0 of tensors does not require grad\"; compute the forward pass "
                    "with grad enabled"))
                continue
            if is_true(b.create_graph) and model.grad_mode(call) is GradMode.DISABLED:
                user = self._disabled_user(model, call)
                if user is not None:
                    yield Finding.from_text(call.node, (
                        "`create_graph=True` under a grad-disabled region, and the gradients are used in that "
                        "region, so the penalty built from them has no graph and contributes no gradient; "
                        "compute the gradients and the penalty outside `no_grad` (or inside "
                        "`torch.enable_grad()`)"))

    @staticmethod
    def _disabled_user(model: FileModel, call: Call) -> Optional[Assign]:
        """A binding run with grad disabled that reads the result of the
        ``create_graph=True`` call (``penalty = (g.norm() - 1) ** 2``)."""
        names: set[str] = set()
        for a in model.assigns_in_scope(call.scope):
            if a.statement is call.statement and a.kind in ("assign", "annassign", "walrus"):
                names |= {t.text for t in a.targets if t.text}
        if not names:
            return None
        for a in model.assigns_in_scope(call.scope):
            if a.order > call.order and a.statement is not call.statement and a.value is not None \
                    and names & names_in(a.value) and model.grad_mode(a) is GradMode.DISABLED:
                return a
        return None


def _short(model: FileModel, node) -> str:
    text = model.module.code_for_node(node)
    return f"`{text}`" if len(text) <= 40 and "\n" not in text else "the tensor"
