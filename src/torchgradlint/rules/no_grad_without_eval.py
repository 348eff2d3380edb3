"""TGL201 no-grad-without-eval."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ..analysis.literals import is_literal, plain_bindings
from ..analysis.model import FileModel, GradMode, unwrap
from ..analysis.names import dotted_name
from ..analysis.modes import (
    HELPER_TRAIN,
    TRAINED,
    dropout_free_at,
    events,
    gated_off_at,
    initialises_fresh_module,
    is_module_at,
    method_sensitive,
    module_method_classes,
    modes_at,
    mode_sensitive_at,
    recalibrates_statistics,
    statistics_free_at,
    switched_to_training_for,
    trains_sensitive_module_at,
    visibly_sensitive_at,
)
from ..analysis.steps import optimizer_step
from ..analysis.torch_api import FORWARD_METHODS, MODULE_RETURNING_METHODS
from ..analysis.training import feeds_backward, iterates_data, loop_trains, step_span
from ..analysis.steps import foreign_framework_file
from ..registry import Finding, Rule


class NoGradWithoutEval(Rule):
    """A module runs under ``no_grad``/``inference_mode`` while it may still
    be in training mode.

    Rests on: ``torch.nn.Module.eval`` / ``torch.nn.Module.train`` and the
    autograd notes "no_grad vs eval": disabling grad mode does not switch
    dropout or batch norm to inference behaviour.
    """

    code = "TGL201"
    name = "no-grad-without-eval"
    summary = "module evaluated under no_grad/inference_mode while it may be in training mode"
    probe = "module-mode"
    # an evaluation loop without no_grad follows training: "backward" is in the file
    prefilter = (("no_grad", "inference_mode", "set_grad_enabled", "volatile", "backward", ".train("),)
    ast_prefilter = "evaluates-trained-module"  # a grad-mode API, a `.train(` call or a backward call
    docs = """
## What it does
Checks for modules called inside `torch.no_grad()`, `torch.inference_mode()`
or `torch.set_grad_enabled(False)` (blocks or decorated functions) while they
may still be in training mode: the module was trained (it took part in a
backward or an optimizer step) or `.train()`-ed earlier in the same function
or loop — including later in an enclosing loop body, which runs before the
next iteration — or, for an evaluation helper, a same-file caller trained it
and did not call `.eval()` first. A module is in training mode from its
construction too: a model-zoo backbone or a module built by a plain class (a
trainer, tester or agent that is no `nn.Module`) is reported in the class's
methods when no code of the file may switch it to eval mode. A `.eval()` in a branch the call is not in
(`if (epoch + 1) % k == 0: model.eval()` inside the epoch loop, then a final
test after it) leaves the modes before it possible too; an `if`/`else` that
sets the mode in every branch, `if model is not None:`, `if isinstance(model,
nn.Module):` and `if model.training: model.eval()` do not. A method the file
defines on the module class counts as a call of the module when it runs a
mode-dependent layer (`ae.get_code(x)` whose body runs the batch-norm
encoder; not a `decode` that runs only a linear layer, nor a method that
calls `self.eval()` itself). A pre-0.4 input `Variable(x, volatile=True)`
marks the call as an evaluation too (that flag was PyTorch's `no_grad`
and does nothing since 0.4), for a module visibly built with dropout or
batch norm in the file (a model-zoo backbone, an `nn` layer, a same-file
class that holds one).

It stays silent when `model.eval()` or `model.train(False)` runs before the
call (in the function, in every same-file caller, or inside the `no_grad`
block), when the block calls no module (EMA updates, `p.copy_(...)`), inside
`torch.enable_grad()`, when the module is defined in the same file without
dropout or batch-norm layers or its forward applies them only under a
parameter the call leaves off (`def forward(self, x, is_training=False)`
with `if is_training: h = self.dropout(h)`, called as `model(x)`), and for deliberate batch-norm statistics passes
(the call's output is discarded, or bound to names never read after an
explicit `.train()` that nothing trains after, as BigGAN's standing statistics
are, or the function calls `reset_running_stats()`, as a hand-written
`torch.optim.swa_utils.update_bn` does), and for Monte-Carlo
dropout: `model.train()` called for the sampling that follows it (no training
after it before the next mode switch, the module handed to no unknown
function) on a module whose visible layers hold no batch norm. Nor does it report a
generator whose only mode-dependent layers are batch norm, sampled on random
noise (`torch.randn(...)`, directly or through a name such as `fixed_noise`)
inside the loop that trains it, the PyTorch DCGAN tutorial's progress images:
the noise has the statistics of the training batches, so this is a
training-mode forward on a training-like batch, not an evaluation on held-out
data. With dropout in the generator it is still reported. A dummy forward of
a module built and not trained yet whose output is never read (`with
torch.no_grad(): out = model(data)` to initialise lazy modules, as PyTorch
Geometric's examples write it), or whose output is read only for its shape
(`print(out.shape)` after building a UNet), evaluates nothing and is not
reported either (unless the module holds weights already: a model-zoo model
or a loaded state dict has nothing lazy to initialise);
nor is a pass over the data whose outputs are summed into a loss that is
backpropagated after the loop (an auxiliary loss over the whole training
set). PyTorch Geometric's `GCN`/`GraphSAGE`/`GIN`/`GAT`/`PNA`/`EdgeCNN`
models count as mode-free unless the constructor call gives them a `dropout`
other than 0, a `norm` or `**kwargs`, and so do opacus's `DPLSTM`/`DPGRU`/
`DPRNN` without a `dropout`; a PEFT model (`get_peft_model(model, config)`) is
mode-sensitive through its base and the adapter dropout its `peft.*Config`
gives (0 by default). A class of another project file is judged by its code
through the project index, kind by kind (dropout, batch-norm statistics),
and a class is judged by what its constructor builds for the literal
arguments each construction gives it (`ResidualBlock(d, resample='down')`
whose `__init__` builds `nn.LayerNorm` for `'down'` and `nn.BatchNorm2d`
otherwise holds no batch norm).

## Why is this bad?
`no_grad` only stops autograd from recording the graph; it does not change the
module's mode. A module in training mode keeps dropout active, so evaluation
outputs are random and metrics are noisy, and its batch-norm layers normalise
with the statistics of the evaluation batch and *overwrite their running mean
and variance* with evaluation data — the model you save is no longer the one
you trained.

## Example
```python
for epoch in range(epochs):
    for x, y in train_loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    with torch.no_grad():
        val_logits = model(x_val)
```

## Use instead
```python
for epoch in range(epochs):
    model.train()
    for x, y in train_loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_logits = model(x_val)
```

## References
- [torch.nn.Module.eval](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval)
- [torch.nn.Module.train](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.train)
- [torch.no_grad](https://pytorch.org/docs/stable/generated/torch.no_grad.html)
- Autograd mechanics, "Locally disabling gradient computation" — no_grad vs eval:
  <https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation>
"""

    @staticmethod
    def _evaluation_loops(model: FileModel) -> Iterator[Finding]:
        """A loop over a data source that runs a trained module with grad
        enabled and no backward: an evaluation pass without ``no_grad`` after
        training the module (or passing it to a same-file helper that leaves
        it in training mode) in the same function, still in training mode."""
        found: dict[int, tuple] = {}  # id(loop) -> (loop, module texts in call order)
        for call in model.calls:
            loop = call.loop
            if loop is None or model.grad_mode(call) is GradMode.DISABLED:
                continue
            text = _module_text(call)
            if text is None or text in found.get(id(loop), (None, []))[1] or not is_module_at(model, call, text):
                continue
            if not iterates_data(model, loop) or loop_trains(model, loop) or any(
                    optimizer_step(model, c) for c in model.calls_within(loop.order, loop.end)):
                continue
            if not modes_at(model, call, text) & {TRAINED, HELPER_TRAIN} or not mode_sensitive_at(model, call, text) \
                    or gated_off_at(model, call, text):
                continue
            if recalibrates_statistics(model, call, text) or _during_construction(model, call.scope):
                continue
            if feeds_backward(model, call, after_loops=True):
                continue  # a training pass whose sum is backpropagated after the loop
            found.setdefault(id(loop), (loop, []))[1].append(text)
        for loop, texts in found.values():
            names = " and ".join(f"`{t}`" for t in texts)
            evals = " and ".join(f"`{t}.eval()`" for t in texts)
            trains = " and ".join(f"`{t}.train()`" for t in texts)
            yield Finding.from_text(loop.node, (
                f"this loop evaluates {names} after training {'it' if len(texts) == 1 else 'them'}, without "
                f"{evals}: dropout stays active and batch-norm running statistics are overwritten by evaluation "
                f"data (and without `torch.no_grad()` every batch builds a graph); call {evals} before the loop "
                f"and {trains} after"))

    def check(self, model: FileModel) -> Iterator[Finding]:
        if foreign_framework_file(model):
            return
        yield from self._evaluation_loops(model)
        if not model.regions and not any(s.decorator_region for s in model.scopes) \
                and not any(c.method == "generate" for c in model.calls) and not _mentions_volatile(model):
            return
        reported: set[tuple[int, str]] = set()
        for call in model.calls:
            text = _module_text(call)
            if text is None:
                continue
            disabled = model.grad_mode(call) is GradMode.DISABLED
            generate = not disabled and _library_generate(model, call)  # runs under generate's own no_grad
            volatile = not disabled and not generate and _volatile_input(model, call)
            disabled = disabled or volatile  # pre-0.4 ``Variable(x, volatile=True)``: meant as no_grad
            if not disabled and not generate:
                continue
            methods = module_method_classes(model, call) if disabled else None
            if methods:
                text = call.receiver_text  # ``ae.get_code(x)``: the method runs ``ae``'s layers
            if not is_module_at(model, call, text):
                continue
            region = call.region or call.scope.decorator_region
            key = (id(region) if region is not None else id(call.scope), text)
            if key in reported:
                continue
            if not trains_sensitive_module_at(model, call, text) or gated_off_at(model, call, text):
                continue  # (or its forward runs dropout only when asked: ``if is_training:``)
            if volatile and not visibly_sensitive_at(model, call, text):
                continue  # a legacy script's own models: report only what visibly holds dropout or batch norm
            if methods and not all(method_sensitive(model, info, name) for info, name in methods):
                continue  # the method runs none of the mode-dependent layers (or switches the mode itself)
            if recalibrates_statistics(model, call, text):
                continue  # a hand-written update_bn pass: training mode on purpose
            if switched_to_training_for(model, call, text) and statistics_free_at(model, call, text):
                continue  # Monte-Carlo dropout: `.train()` chosen for this sampling, no statistics to spoil
            if _during_construction(model, call.scope) or initialises_fresh_module(model, call, text):
                continue  # a shape probe or a lazy-module initialisation: nothing trained to evaluate yet
            if feeds_backward(model, call) and _trained_in_loop(model, call, text):
                continue  # a training-time forward (GAN sample, RL rollout, pseudo-labels), not an evaluation
            if _samples_noise(model, call) and dropout_free_at(model, call, text) \
                    and _trained_in_loop(model, call, text):
                continue  # a batch-norm generator sampled on noise in its own training loop (DCGAN's images)
            reported.add(key)
            api = region.api if region is not None else "torch.no_grad"
            if volatile:
                yield Finding.from_text(call.node, (
                    f"`{text}` evaluates a `Variable(..., volatile=True)` input but may still be in training mode "
                    f"(trained or `.train()`-ed before, with no `.eval()` in between): dropout stays active and "
                    f"batch-norm running statistics are overwritten by evaluation data; `volatile` does nothing "
                    f"since PyTorch 0.4 either: call `{text}.eval()` and evaluate under `torch.no_grad()`"))
                continue
            if generate:
                yield Finding.from_text(call.node, (
                    f"`{text}.generate(...)` may run `{text}` in training mode: it was trained or `.train()`-ed "
                    f"before, with no `.eval()` in between, and transformers' `generate` (under "
                    f"`torch.no_grad`) keeps the mode, so dropout stays active while it generates; call "
                    f"`{text}.eval()` before generating and `{text}.train()` after"))
                continue
            yield Finding.from_text(call.node, (
                f"`{text}` runs under `{api}` but may still be in training mode (trained or `.train()`-ed "
                f"before, with no `.eval()` in between): dropout stays active and batch-norm running "
                f"statistics are overwritten by evaluation data; call `{text}.eval()` before evaluating "
                f"and `{text}.train()` after"))


def _mentions_volatile(model: FileModel) -> bool:
    return model.cached("mentions-volatile", lambda: "volatile" in model.source)


def _volatile_input(model: FileModel, call) -> bool:
    """Whether a positional argument of ``call`` is a ``Variable(x,
    volatile=True)`` (pre-0.4 PyTorch's no_grad), directly or through names
    every binding of which that may reach the call is one (``inputs =
    Variable(inputs, volatile=True).cuda()``)."""
    if not _mentions_volatile(model):
        return False
    return any(a.keyword is None and not a.star and _volatile(model, a.value, call) for a in call.node.args)


def _volatile(model: FileModel, node: cst.BaseExpression, at, depth: int = 0) -> bool:
    node = unwrap(node)
    if isinstance(node, cst.Call):
        return (dotted_name(node.func) or "").rsplit(".", 1)[-1] == "Variable" and any(
            a.keyword is not None and a.keyword.value == "volatile" and is_literal(a.value, True) for a in node.args)
    if isinstance(node, cst.Name) and depth < 3:
        bindings = plain_bindings(model, node.value, at)
        return bindings is not None and all(b.kind == "assign" and _volatile(model, b.value, b, depth + 1)
                                            for b in bindings)
    return False


def _module_text(call) -> "str | None":
    """The module a call runs the forward of: ``model`` for ``model(x)``,
    ``model.forward(x)`` and ``model.generate(x)``."""
    text = call.func_text
    if not text or text in ("self", "cls"):
        return None
    head, _, last = text.rpartition(".")
    if head and last in FORWARD_METHODS:
        return head
    return text


_GENERATING_LIBRARIES = ("transformers", "peft")


def _library_generate(model: FileModel, call) -> bool:
    """Whether ``call`` is ``model.generate(...)`` of a transformers model: the
    file imports transformers or PEFT and ``generate`` is no method of the file.
    ``GenerationMixin.generate`` is decorated with ``torch.no_grad()`` and runs
    the model in whatever mode it is in. (A project's own model class with a
    ``generate`` method, imported from another file, is not assumed to be one.)"""
    if call.method != "generate" or call.receiver_text in (None, "self", "cls") or model.resolve_callee(call):
        return False
    if _built_by_another_library(model, call):
        return False
    return model.cached("imports-generating-library", lambda: any(
        v.split(".")[0] in _GENERATING_LIBRARIES for v in model.names.aliases.values()))


def _built_by_another_library(model: FileModel, call) -> bool:
    """Whether every binding of the receiver of ``call`` that may reach it is a
    call of a name imported from a package other than transformers and PEFT
    (``model = MambaLM(config)`` with ``from mambapy.mamba_lm import MambaLM``):
    that model's ``generate`` is its own, not ``GenerationMixin.generate``."""
    text = call.receiver_text
    bindings = model.reaching_bindings(text, call) or [a for a in model.assigns if a.binds(text)]
    if not bindings:
        return False
    for a in bindings:
        value = unwrap(a.value, MODULE_RETURNING_METHODS) if a.kind in ("assign", "annassign") \
            and not a.unpacked else None
        qn = model.qualname(value.func) if isinstance(value, cst.Call) else None
        head = (dotted_name(value.func) or "").split(".")[0] if isinstance(value, cst.Call) else ""
        if not qn or "." not in qn or qn.split(".")[0] in _GENERATING_LIBRARIES or head not in model.names.aliases:
            return False
    return True


def _during_construction(model: FileModel, scope, depth: int = 0) -> bool:
    """Whether ``scope`` is ``__init__`` or a helper only ``__init__`` calls
    (``_get_final_flattened_size()``: a dummy forward to size a layer)."""
    fn = model.enclosing_function(scope)
    if fn is None or depth > 2:
        return False
    if fn.name == "__init__":
        return True
    callers = model.callers_of(fn)
    return bool(callers) and all(_during_construction(model, c.scope, depth + 1) for c in callers)


_NOISE = frozenset({"torch.randn", "torch.rand", "torch.randn_like", "torch.rand_like", "torch.normal"})


def _samples_noise(model: FileModel, call) -> bool:
    """Whether the module call's input is random noise drawn with
    ``torch.randn``/``rand``/``normal`` (directly or through a name every
    binding of which draws it): sampling a generative model. With batch norm
    as its only mode-dependent layer and trained on noise of the same
    distribution in the loop, such a sample is a training-mode forward on a
    training-like batch, not an evaluation on held-out data (dropout, as in
    diffusion UNets, would still make the samples worse)."""
    args = [a.value for a in call.node.args if a.keyword is None and not a.star]
    if not args:
        return False
    value = args[0]
    if isinstance(value, cst.Name):
        bindings = model.reaching_bindings(value.value, call)
        if not bindings:
            return False
        return all(b.kind in ("assign", "annassign") and not b.unpacked and _is_noise(model, b.value)
                   for b in bindings)
    return _is_noise(model, value)


def _is_noise(model: FileModel, node) -> bool:
    return isinstance(node, cst.Call) and model.qualname(node.func) in _NOISE


def _trained_in_loop(model: FileModel, call, text: str) -> bool:
    """Whether the module ``text`` is itself trained in the training step
    around ``call`` (:func:`step_span`: the model being trained, not a
    frozen teacher)."""
    span = step_span(model, call)
    if span is None:
        return False
    if any(e.kind == TRAINED and span[0] <= e.order <= span[1] for e in events(model, call.scope, text)):
        return True
    # a forward of the same module with grad enabled in the step whose output is backpropagated (through a
    # helper such as ``backward(total_loss, scaler)``): open_clip's cached-feature accumulation
    return any(c is not call and c.scope is call.scope and _module_text(c) == text
               and model.grad_mode(c) is not GradMode.DISABLED and feeds_backward(model, c)
               for c in model.calls_within(*span))
