"""TGL001 missing-zero-grad."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ..analysis.grad_handoff import GradHandoff, grad_handoffs
from ..analysis.literals import is_literal
from ..analysis.model import Call, FileModel, argument_for
from ..analysis.names import dotted_name
from ..analysis.steps import (
    GradReset,
    backward_call,
    closure_functions,
    covers,
    foreign_framework_file,
    fresh_in_loop,
    function_resets,
    is_optimizer,
    optimizer_owner,
    reset_covers,
    resets_within,
)
from ..analysis.training import step_sites, training_loop_of
from ..registry import Finding, Rule


class MissingZeroGrad(Rule):
    """A training loop steps an optimizer but never resets gradients.

    Rests on: ``torch.optim.Optimizer.zero_grad`` and ``torch.Tensor.backward``
    ("this function accumulates gradients in the leaves").
    """

    code = "TGL001"
    name = "missing-zero-grad"
    summary = "optimizer step in a training loop that never resets gradients"
    probe = "stale-gradients"
    prefilter = (("backward",), ("step",))
    # check(): a training loop is a loop that runs a backward (analysis.training.has_backward).
    needs_backward = True
    docs = """
## What it does
Checks for loops that call `backward()` and step an optimizer, but never reset
the gradients (`optimizer.zero_grad()`, `model.zero_grad()`, `p.grad = None`,
or a same-file helper that does one of these) anywhere in the loop.

## Why is this bad?
`backward()` *adds* into `.grad`. Without a reset, every step applies the sum
of the current gradient and all earlier ones, so the effective learning rate
grows with the step count and the update direction is dominated by stale
batches. Training still runs and the loss may even fall at first, so the bug
is easy to miss.

Gradient accumulation is fine: a reset anywhere in the loop (for example under
`if step % k == 0:`) keeps the rule silent, as does an LBFGS closure that
zeroes gradients, or a helper called in the loop that does. A loop that calls a
helper which backpropagates and steps (`train_step(batch)`) is judged as if
the helper's body were inline, and reported at the helper call; a helper that
holds its own training loop is reported there, once. A reset aimed at one
optimizer (`opt_d.zero_grad()`) does not cover a second optimizer constructed
in the same file (`opt_g.step()` in a GAN loop); one aimed at the optimizer a
stepped wrapper holds covers the wrapper (`self.opt.step()` then
`self.opt.optimizer.zero_grad()`, a learning-rate schedule such as `NoamOpt`),
and a module reset covers the optimizer of the object the module was taken
from (`dynamic_net = run_manager.network`, `dynamic_net.zero_grad()`,
`run_manager.optimizer.step()`). Files that import another
framework (MXNet, TensorFlow, JAX...) and not torch are skipped. A step
function that a library runs once per iteration as its whole training step
(`Engine(update_fn)`, PyTorch Ignite, which resets no gradient itself) is
judged as a loop body: a backward and a step in it with no reset are
reported.

It also checks gradients handed from one model to another by reference, as
asynchronous actor-critic (A3C) workers do: a local model backpropagates, its
gradients are given to the shared model (`shared_param._grad = param.grad`,
inline or in a helper such as `ensure_shared_grads(model, shared_model)`) and an
optimizer over the shared model steps. Since PyTorch 2.0, `optimizer.zero_grad()`
sets the shared gradients to `None` by default and never touches the local
tensors, so unless the local model's gradients are reset too (`model.zero_grad()`,
`p.grad = None`) or the shared ones are zeroed in place
(`zero_grad(set_to_none=False)`, which zeroes the very same tensors), every step
applies the sum of all earlier gradients. A local model built anew in every
iteration starts without gradients and is not reported.

## Example
```python
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
```

## Use instead
```python
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
```

## References
- [torch.optim.Optimizer.zero_grad](https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html)
- [torch.Tensor.backward](https://pytorch.org/docs/stable/generated/torch.Tensor.backward.html)
- [Zeroing out gradients in PyTorch](https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        if foreign_framework_file(model):
            return
        for site in step_sites(model, model.module_scope.order, model.module_scope.end):
            if site.in_helper_loop:
                continue  # judged at the helper's own training loop
            loop = training_loop_of(model, site)
            if loop is not None and site.via is site.step.call and fresh_in_loop(
                    model, site.step.optimizer, site.step.call, loop):
                continue  # a new optimizer over new parameters every iteration: no gradient survives it
            span = (loop.order, loop.end) if loop is not None else _step_function(model, site)
            if span is None:
                continue
            resets = [r for r in resets_within(model, *span)
                      if r.fact is None or not model.exclusive(r.fact, site.via)]
            if loop is None and not resets:
                fn = model.enclosing_function(site.via.scope)
                driver = _iteration_driver(model, fn) if site.via is site.step.call else None
                if driver is not None:
                    opt = site.step.optimizer or "the optimizer"
                    yield Finding(site.step.call.node, (
                        f"`{opt}` steps after `backward()` in `{fn.name}`, which `{driver}(...)` runs once per "
                        "iteration, but its gradients are never reset"), detail=(
                        f"so each step applies the sum of all earlier gradients; call `{opt}.zero_grad()` in "
                        f"`{fn.name}` before the backward"))
                continue  # a step function without any reset: its callers' job
            if loop is None and site.via is site.step.call and fresh_in_loop(
                    model, site.step.optimizer, site.step.call, model.enclosing_function(site.via.scope)):
                continue  # an optimizer over parameters built in this very call: nothing stale to apply
            if any(function_resets(model, fn)
                   for fn in closure_functions(model, site.step.closure, site.step.call)):
                continue
            stepped = _canonical(model, site.step.optimizer, site.step.call)
            passed = _passed_optimizer(model, site)
            if passed is not None:
                stepped = _canonical(model, passed, site.via)  # ``step(G, x, opt_g)``: the helper steps ``opt_g``
            elif resets and loop is not None and _outer_parameter(model, site.step.optimizer, site.step.call, loop):
                continue  # a closure's parameter: which optimizer the loop's reset clears is unknown
            if resets and (not is_optimizer(model, site.step.optimizer) or any(
                    reset_covers(model, GradReset(r.order, _canonical(model, r.target, r.fact), r.fact, r.module),
                                 stepped, site.step.call) for r in resets)):
                # A reset silences the step unless the stepped optimizer is
                # provably another one (or another module's), or the gradients it
                # steps are another module's, handed over by reference and never reset.
                handoff = _unreset_handoff(model, site, loop, span, resets)
                if handoff is not None:
                    message, detail = _handoff_message(site.step.optimizer or "the optimizer", handoff, resets)
                    yield Finding(site.step.call.node, message, detail=detail)
                continue
            if loop is None:
                first = _first_backward(model, span, site.via.order)
                yield Finding((first or site.via).node, (
                    f"`{site.step.optimizer}` steps after `backward()` in this function, which resets other "
                    "gradients but never this optimizer's: each call adds onto the gradients earlier calls "
                    f"left, so every step applies their sum; reset them (`{site.step.optimizer}.zero_grad()`) "
                    "before the backward"))
                continue
            opt = passed or site.step.optimizer or "the optimizer"
            if site.via is site.step.call:
                msg = (f"`{opt}` steps in a loop with `backward()` but its gradients are never reset in the loop, "
                       f"so each step applies the sum of all earlier gradients; call `{opt}.zero_grad()` "
                       "once per iteration")
            else:
                msg = (f"`{site.via.func_text}(...)` steps `{opt}` in a loop with `backward()` but gradients are "
                       "never reset in the loop or the helper, so each step applies the sum of all earlier "
                       "gradients; call `zero_grad()` once per iteration")
            yield Finding.from_text(site.via.node, msg)


#: library calls that run a given function once per iteration as the training step
_ITERATION_DRIVERS = frozenset({"ignite.engine.Engine", "ignite.engine.engine.Engine",
                                "ignite.engine.DeterministicEngine", "ignite.engine.deterministic.DeterministicEngine"})


def _unreset_handoff(model: FileModel, site, loop, span, resets) -> Optional[GradHandoff]:
    """A handoff (:mod:`torchgradlint.analysis.grad_handoff`) of gradients that
    ``site``'s optimizer steps, whose source module nothing in ``span`` (the
    training loop, or the step function and the loops that call it) resets."""
    if site.via is not site.step.call:
        return None  # judged at the step itself
    handoffs = grad_handoffs(model, *span)
    if not handoffs:
        return None
    owner = optimizer_owner(model, site.step.optimizer)
    where = loop if loop is not None else model.enclosing_function(site.via.scope)
    at = site.step.call.order
    # the handoff nearest before the step first (``opt_a.step()`` after its own handoff, then ``opt_b``'s)
    # ``shared_param.grad = param.grad`` overwrites the shared gradient but is a handoff, not a reset
    resets = [r for r in resets if r.fact is None or all(getattr(r.fact, "node", None) is not h.node
                                                         for h in handoffs)]
    for h in sorted(handoffs, key=lambda h: (h.order > at, -h.order if h.order < at else h.order)):
        if owner is not None and not covers(owner, h.target):
            continue
        if where is not None and fresh_in_loop(model, h.source, site.step.call, where):
            continue  # a new local model every iteration: its gradients start at None
        if any(_resets_source(model, r, h) for r in resets):
            continue
        if loop is None and _callers_reset(model, where, h.source):
            continue
        return h
    return None


def _resets_source(model: FileModel, reset: GradReset, handoff: GradHandoff) -> bool:
    """Whether ``reset`` clears the gradients of the handoff's source module: a
    reset of unknown reach, ``source.zero_grad()``, or
    ``opt.zero_grad(set_to_none=False)``, which zeroes the shared tensor in place
    (``reset`` is no handoff itself: :func:`_unreset_handoff` leaves those out)."""
    fact = reset.fact
    if reset.target is not None:
        flag = fact.arg(0, "set_to_none") if isinstance(fact, Call) else None
        return is_literal(flag, False) or covers(optimizer_owner(model, reset.target) or frozenset(),
                                                 handoff.source)
    if reset.module is not None:
        return covers(frozenset({handoff.source}), reset.module)
    return True


def _callers_reset(model: FileModel, fn, source: str) -> bool:
    """Whether a loop that calls the step function ``fn`` resets gradients of
    unknown reach or those of the module passed for ``source``."""
    if fn is None:
        return True
    head = source.partition(".")[0]
    for call in model.callers_of(fn):
        arg = argument_for(call, fn, head) if head in fn.params else None
        passed = dotted_name(arg) if arg is not None else source
        span = (call.loop.order, call.loop.end) if call.loop is not None else None
        if span is None:
            continue
        for r in resets_within(model, *span):
            if r.fact is call:
                continue  # the step function's own resets
            if r.target is None and (r.module is None or covers(frozenset({passed or source}), r.module)):
                return True
    return False


def _handoff_message(opt: str, h: GradHandoff, resets) -> tuple[str, str]:
    """``(message, detail)`` of a step of gradients handed over and never reset."""
    reset = next((r for r in resets if r.target is not None), None)
    how = (f"Since PyTorch 2.0, `{reset.target}.zero_grad()` sets `{h.target}`'s gradients to None by default "
           f"and leaves `{h.source}`'s alone" if reset is not None else f"Nothing resets `{h.source}`'s gradients")
    return (f"`{opt}` steps `{h.source}`'s gradients, handed to `{h.target}` by reference and never reset",
            f"{how}: after `{h.text}` both hold the same tensors, so each backward adds onto all earlier "
            f"gradients and every step applies their sum. Call `{h.source}.zero_grad()` before the backward.")


def _canonical(model: FileModel, text, at, depth: int = 0):
    """The name an optimizer alias stands for (``opt = optimizer`` ->
    ``optimizer``), followed through plain rebindings."""
    if not text or at is None or depth > 3:
        return text
    binding = model.reaching_binding(text, at)
    if binding is not None and binding.kind == "assign" and not binding.unpacked \
            and dotted_name(binding.value) is not None:
        return _canonical(model, dotted_name(binding.value), binding, depth + 1)
    return text


def _passed_optimizer(model: FileModel, site) -> Optional[str]:
    """For a step in a same-file helper that the loop calls directly
    (``site.via``), when the stepped optimizer is a parameter of that helper:
    the dotted name the call passes for it (``step(G, x, opt_g)`` -> ``opt_g``)."""
    text = site.step.optimizer
    if not text or site.via is site.step.call:
        return None
    callee = model.enclosing_function(site.step.call.scope)
    head = text.split(".")[0]
    if callee is None or not _only_parameter(model, head, callee):
        return None
    if not any(callee is s for s in model.resolve_callee(site.via)):
        return None
    arg = argument_for(site.via, callee, head)
    name = dotted_name(arg) if arg is not None else None
    return name + text[len(head):] if name else None


def _outer_parameter(model: FileModel, text: Optional[str], at: Call, loop) -> bool:
    """Whether the optimizer ``text`` that a step in a helper reached from
    ``loop`` steps is a parameter of that helper or of a function enclosing
    it (``def make_step(task, optimizer): def train_step(batch): ...
    optimizer.step()``), outside the loop's own function: the loop's caller
    decides which optimizer it is, so a reset in the loop may well be of the
    same one (open_clip zeroes ``optimizer`` and calls the compiled step)."""
    if not text or loop.contains(at.order):
        return False
    head = text.split(".")[0]
    scope = at.scope
    while scope is not None and scope.kind != "module":
        if model.bindings_of(head, scope) or head in scope.params:
            return _only_parameter(model, head, scope)
        scope = scope.parent
    return False


def _only_parameter(model: FileModel, name: str, scope) -> bool:
    """Whether ``name`` is a parameter of the function ``scope`` that the function never rebinds."""
    return name in scope.params and all(b.kind == "param" for b in model.bindings_of(name, scope))


def _iteration_driver(model: FileModel, fn) -> Optional[str]:
    """The text of a library call that runs the same-file function ``fn`` once
    per iteration as its whole training step (``Engine(update_fn)``, PyTorch
    Ignite's :class:`~ignite.engine.Engine`: its ``process_function`` is the
    loop body; Ignite resets no gradient itself), else ``None``."""
    if fn is None or fn.kind != "function" or fn.class_name is not None:
        return None
    for call in model.calls:
        if (call.qualname or "") not in _ITERATION_DRIVERS:
            continue
        arg = call.arg(0, "process_function")
        if isinstance(arg, cst.Name) and arg.value == fn.name:
            return call.func_text
    return None


def _step_function(model: FileModel, site):
    """The span of the function a loop-free optimizer step runs in, when
    that function also runs a backward before the step."""
    fn = model.enclosing_function(site.via.scope)
    if fn is None or _first_backward(model, (fn.order, fn.end), site.via.order) is None:
        return None
    return (fn.order, fn.end)


def _first_backward(model: FileModel, span, before: int):
    """The first backward before ``before`` in ``span`` that adds into ``.grad``
    (``torch.autograd.grad`` returns its gradients and accumulates nothing)."""
    for c in model.calls_within(*span):
        if c.order < before and (b := backward_call(model, c)) is not None and b.accumulates:
            return c
    return None
