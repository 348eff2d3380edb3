"""TGL002 backward-under-no-grad."""

from __future__ import annotations

from typing import Iterator, Optional

from ..analysis.model import Assign, Call, FileModel, GradMode, Region, gate_parameters, left_off_by_callers, names_in
from ..analysis import modes
from ..analysis.names import dotted_name
from ..analysis.provenance import built_under_enable_grad, computed_under_no_grad, module_cuts_graph, provenance
from ..analysis.summaries import (
    attribute_reads,
    checks_grad_mode,
    leaves_grad_disabled,
    parameter_attributes,
    reached_from_forward,
    trainable_evidence,
)
from ..analysis.steps import backward_call, is_true
from ..analysis.training import step_sites
from ..registry import Finding, Rule


def _region_text(model: FileModel, region: Region) -> str:
    api = region.api or "torch.no_grad"
    if region.kind == "decorator":
        return f"`@{api}` on the enclosing function"
    if region.kind == "statement":
        return f"`{api}(False)`"
    return f"`with {api}()`"


def _gated_off(model: FileModel, call) -> bool:
    """Whether the backward ``call`` sits under an ``if p:`` / ``if p is not
    None:`` on a parameter ``p`` of its function that every same-file caller
    leaves at ``None``/``False``/``0``: on those paths it never runs (a
    ``loss_batch(..., opt=None)`` evaluated under ``no_grad``)."""
    fn = model.enclosing_function(call.scope)
    return fn is not None and any(left_off_by_callers(model, fn, p) for p in gate_parameters(model, call))


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
    probe = "grad-mode"
    prefilter = (("backward", "grad"), ("no_grad", "inference_mode", "set_grad_enabled"))
    # check(): findings sit at backward calls, or at a no_grad region that cuts a
    # parameter's only path (a file with no backward call can hold that one).
    docs = """
## What it does
Checks for `backward()`, `torch.autograd.backward`, `torch.autograd.grad` and
`accelerator.backward` on a tensor whose forward pass ran inside a
`torch.no_grad()` / `torch.inference_mode()` region (the same region, an
enclosing one, a `@torch.no_grad()` / `@torch.inference_mode()` decorated
function, or after `torch.set_grad_enabled(False)`), and for
`torch.autograd.grad(..., create_graph=True)` called with grad disabled when
its gradients are used (a penalty computed) in that region. It also checks
module classes whose `forward` is decorated `@torch.no_grad()` /
`@torch.inference_mode()` while the class offers to make itself trainable (an
*unfreeze* option such as `unfreeze_mm_vision_tower`, or
`requires_grad_(True)`), backwards whose loss depends on an inference
tensor made inside a same-file module's `forward`, and a backward run by a
module's own `forward` (a gradient-penalty loss module) with no
`torch.is_grad_enabled()` check, in a file that evaluates under `no_grad`:
evaluation calls the module with grad disabled.

It stays silent on a backward under `if opt is not None:` (or `if opt:`) in a
helper whose every same-file caller leaves `opt` at `None` (passes nothing over
a `None` default, passes `None`, or passes on a parameter its own callers
leave off): "What is torch.nn really?"'s `loss_batch(..., opt=None)` evaluated
under `no_grad` never runs that backward.

## Why is this bad?
With grad disabled autograd records nothing: every result has
`requires_grad=False` and no `grad_fn`, so `backward()` raises
`RuntimeError: element 0 of tensors does not require grad and does not have a
grad_fn`. A gradient penalty written as
`torch.autograd.grad(..., create_graph=True)` inside `no_grad`, with the
penalty computed in the same region, has no graph: it adds a constant to the
loss and contributes no gradient. Training runs, the regulariser silently does
nothing.

An unfrozen module whose `forward` runs under `@torch.no_grad()` gets no
gradient from any loss built on its output: fine-tuning it silently does
nothing (TinyLLaVA's `--tune_vision_tower`, issue #17). A frozen tower with no
option to unfreeze it is not flagged.

Computing the loss outside the region and calling `backward()` inside it works
and is not flagged, nor is a forward and backward inside `torch.enable_grad()`
nested in `no_grad`, nor a backward in a module's `forward` through a tensor
computed there inside `torch.enable_grad()` / `torch.set_grad_enabled(True)`
(its graph exists in any caller's mode). `set_grad_enabled(flag)` with a non-literal flag is never
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
        if not model.regions and not any(s.decorator_region for s in model.scopes) \
                and not any(c.method == "__enter__" for c in model.calls):
            return  # nothing disables grad (``torch.no_grad().__enter__()`` is no region)
        yield from self._at_backwards(model)
        yield from self._grad_left_disabled(model)
        yield from self._backward_in_forward(model)
        yield from self._parameters_cut(model)
        yield from self._unfreezable_forward_cut(model)

    def _at_backwards(self, model: FileModel) -> Iterator[Finding]:
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
            if region is not None and _gated_off(model, call):
                continue  # ``if opt is not None: loss.backward()`` and no caller passes ``opt``
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
    def _grad_left_disabled(model: FileModel) -> Iterator[Finding]:
        """A backward in a loop that also calls a same-file helper leaving
        grad disabled (bare ``set_grad_enabled(False)``): from the next
        iteration on, the forward runs without grad and the backward raises."""
        for call in model.calls:
            b = backward_call(model, call)
            loop = call.loop
            if b is None or loop is None:
                continue
            for other in model.calls_within(loop.order, loop.end):
                if other.scope is not call.scope or other is call:
                    continue
                culprit = next((r for fn in model.resolve_callee(other)
                                if (r := leaves_grad_disabled(model, fn)) is not None), None)
                if culprit is None:
                    continue
                yield Finding.from_text(call.node, (
                    f"`{other.func_text}()` leaves grad mode disabled (a bare `{culprit.api}(False)` that is never "
                    "switched back), so after it runs the loop's forward builds no graph and this backward raises "
                    "\"element 0 of tensors does not require grad\"; use `with torch.no_grad():` in the helper"))
                break

    @staticmethod
    def _backward_in_forward(model: FileModel) -> Iterator[Finding]:
        """A backward run by ``nn.Module.forward`` (or a method it calls):
        evaluation calls ``forward`` under ``no_grad`` (trainers' validation
        loops do), where the backward raises, unless the code checks
        ``torch.is_grad_enabled()`` or the forward itself steps an optimizer
        (the module is a training driver, not a model to evaluate)."""
        for call in model.calls:
            b = backward_call(model, call)
            if b is None or call.region is not None:
                continue
            fwd = reached_from_forward(model, call.scope)
            if fwd is None:
                continue
            fn = model.enclosing_function(call.scope)
            if checks_grad_mode(model, fwd) or (fn is not None and checks_grad_mode(model, fn)):
                continue
            if built_under_enable_grad(model, b.target, call):
                continue  # ``with torch.set_grad_enabled(True): scores = critic(x)``: a graph in any caller's mode
            if step_sites(model, fwd.order, fwd.end):
                continue  # the forward steps an optimizer: a training driver (``Imagine()``), never evaluated
            yield Finding.from_text(call.node, (
                f"this backward runs inside `{fwd.qualname}` (a module's forward): evaluation calls the module "
                "under `torch.no_grad()`, where the loss has no graph and backward raises \"element 0 of tensors "
                "does not require grad\"; branch on `torch.is_grad_enabled()` (or `self.training`) first"))

    @staticmethod
    def _parameters_cut(model: FileModel) -> Iterator[Finding]:
        """A parameter whose only use in a module's method goes through a
        same-file module whose ``forward`` returns what it computed under
        ``no_grad``: the parameter never gets a gradient."""
        reported: set[int] = set()
        for cls in modes.module_classes(model):
            params = parameter_attributes(model, cls)
            if not params:
                continue
            for method in model.classes[cls].methods.values():
                for call in model.calls_in_scope(method):
                    region = module_cuts_graph(model, call)
                    if region is None or model.grad_mode(call) is GradMode.DISABLED:
                        continue
                    for arg in call.node.args:
                        text = dotted_name(arg.value)
                        if text not in params or id(region) in reported:
                            continue
                        if len(attribute_reads(model, method, text)) != 1:
                            continue  # also used directly: it still gets gradients
                        reported.add(id(region))
                        yield Finding.from_text(region.node, (
                            f"`{text}` reaches `{method.qualname}`'s output only through `{call.func_text}`, whose "
                            f"forward computes under `{region.api}`: the parameter never receives a gradient, so it "
                            "never trains; compute the constraint with grad enabled (or apply it in place to the "
                            "parameter under no_grad and use the parameter itself)"))

    @staticmethod
    def _unfreezable_forward_cut(model: FileModel) -> Iterator[Finding]:
        """A module class whose ``forward`` is decorated ``@torch.no_grad()`` /
        ``@torch.inference_mode()`` (and never switches grad back on) while the
        class offers to make itself trainable (an *unfreeze* option,
        ``requires_grad_(True)``): once unfrozen, its parameters still get no
        gradient from any loss built on its output, so tuning it silently does
        nothing (the frozen-vision-tower pattern of LLaVA-style encoders)."""
        for cls in sorted(modes.module_classes(model)):
            fwd = model.classes[cls].methods.get("forward")
            region = fwd.decorator_region if fwd is not None else None
            if region is None or region.mode is not GradMode.DISABLED or checks_grad_mode(model, fwd):
                continue
            if any(r.mode is not GradMode.DISABLED and fwd.contains(r.order) for r in model.regions):
                continue  # ``with torch.enable_grad():`` / ``set_grad_enabled(flag)`` inside forward
            evidence = trainable_evidence(model, cls)
            if evidence is None:
                continue
            what = model.module.code_for_node(evidence).strip()
            what = what if len(what) <= 60 and "\n" not in what else "its parameters made trainable"
            yield Finding.from_text(region.decorator or region.node, (
                f"`{cls}.forward` runs under `@{region.api}`, but the class can be made trainable (`{what}`): "
                "once unfrozen, no gradient reaches its parameters through its output, so tuning it silently "
                "does nothing; drop the decorator and freeze with `requires_grad_(False)` instead (or switch "
                "grad mode on `self.training`/the unfreeze option)"))

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
