"""TGL202 train-not-restored."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

from ..analysis.mode_layer_facts import class_has_mode_layers, factory_class
from ..analysis.literals import is_literal
from ..analysis.model import Call, FileModel, GradMode, Loop, Scope
from ..analysis.modes import (
    BUILT,
    EVAL,
    HELPER_TRAIN,
    TRAIN,
    TRAINED,
    UNKNOWN,
    ModeEvent,
    events,
    is_module_at,
    map_into,
    map_out,
    mode_sensitive_at,
    module_classes,
    same_module,
    unwrap,
)
from ..analysis.names import dotted_name
from ..analysis.steps import foreign_framework_file
from ..analysis.training import frozen_module, last_iteration_only
from ..analysis.torch_api import FORWARD_METHODS
from ..registry import Finding, Rule

# explicit mode states: a construction starts a module in training mode
_EXPLICIT = frozenset({EVAL, TRAIN, UNKNOWN, BUILT, HELPER_TRAIN})
_HELPER_DEPTH = 3


@dataclass(frozen=True)
class _Site:
    """Where the module trains inside a loop: a backward/step call, or the call
    of a same-file helper that trains it; ``restores`` when that helper puts the
    module in training mode before it trains."""

    call: Call
    restores: bool


def _switches_to_eval(call: Call) -> bool:
    if call.method == "eval" and not call.node.args:
        return True
    return call.method == "train" and is_literal(call.arg(0, "mode"), False)


def _eval_calls(model: FileModel, call: Call, callee: Scope, depth: int) -> Iterator[tuple[str, Call]]:
    """``(caller-side module name, the eval call)`` for every ``M.eval()`` the
    helper ``callee`` (called at ``call``) runs, through nested helpers."""
    for d in model.calls_within(callee.order, callee.end):
        if d.scope is not callee and model.enclosing_function(d.scope) is not callee:
            continue
        if _switches_to_eval(d) and d.receiver_text:
            outer = map_out(model, call, callee, d.receiver_text)
            if outer:
                yield outer, d
        elif depth < _HELPER_DEPTH:
            for inner in model.resolve_callee(d):
                if inner is callee or inner.contains(d.order):
                    continue
                for name, e in _eval_calls(model, d, inner, depth + 1):
                    outer = map_out(model, call, callee, name)
                    if outer:
                        yield outer, e


def _candidates(model: FileModel, loop: Loop) -> dict[str, list[tuple[Call, Call]]]:
    """Modules put in eval mode inside ``loop`` (directly or by a helper it
    calls), each with ``(call in the loop, the eval call it runs)`` pairs."""
    out: dict[str, list[tuple[Call, Call]]] = {}
    for c in model.calls_within(loop.order, loop.end):
        if c.scope is not loop.scope:
            continue
        if _switches_to_eval(c) and c.receiver_text and c.receiver_text != "cls":
            out.setdefault(c.receiver_text, []).append((c, c))
            continue
        for callee in model.resolve_callee(c):
            if callee.contains(c.order):
                continue
            for name, e in _eval_calls(model, c, callee, 1):
                out.setdefault(name, []).append((c, e))
    return out


def _is_module(model: FileModel, call: Call, text: str) -> bool:
    if text == "self":
        fn = model.enclosing_function(call.scope)
        return fn is not None and fn.class_name in module_classes(model)
    return is_module_at(model, call, text)


def _names(model: FileModel, scope: Scope, text: str) -> set[str]:
    """``text`` and the names ``scope`` binds to exactly it (``model = context.model``,
    ``model = self.train()``)."""
    return {text} | {t.text for a in model.assigns_in_scope(scope) if a.kind == "assign" and not a.unpacked
                     and same_module(a.value, model) == text for t in a.targets if t.text}


def _forward_before(model: FileModel, loop: Loop, names: set[str], order: int) -> bool:
    """Whether a forward of the module (any of ``names``) runs in ``loop``
    before ``order`` with grad not disabled: the module is called, or handed
    to a function that may call it (``compute_loss(model, batch)``)."""
    forwards = names | {f"{n}.{m}" for n in names for m in FORWARD_METHODS}
    for c in model.calls_within(loop.order, order - 1):
        if c.scope is not loop.scope or model.grad_mode(c) is GradMode.DISABLED:
            continue
        if c.func_text in forwards or (c.method not in ("eval", "train", "to", "parameters", "state_dict")
                                       and any(dotted_name(a.value) in names for a in c.node.args)):
            return True
    return False


def _restores_first(evs: list[ModeEvent]) -> bool:
    """Whether a helper's events put the module in training mode (or leave
    its mode to a flag) before it first trains it."""
    for e in evs:
        if e.kind == TRAINED:
            return False
        if e.kind in (TRAIN, UNKNOWN, BUILT, HELPER_TRAIN):
            return True
    return False


def _sites(model: FileModel, loop: Loop, text: str, evs: list[ModeEvent]) -> list[_Site]:
    """Where ``text`` trains in ``loop``: ``TRAINED`` events after a forward
    of the module in the loop, and calls of same-file helpers that train it."""
    out: dict[int, _Site] = {}
    names = _names(model, loop.scope, text)
    for e in evs:
        callees = model.resolve_callee(e.call)
        if not callees:
            if e.kind == TRAINED and _forward_before(model, loop, names, e.order):
                out[id(e.call)] = _Site(e.call, False)
            continue
        for callee in callees:
            inner = map_into(model, e.call, callee, text)
            sub = events(model, callee, inner, 1) if inner else []
            if any(x.kind == TRAINED for x in sub):
                sub = sorted(sub + _indirect_switches(model, callee, callee.order, callee.end, inner),
                             key=lambda x: x.order)
                out[id(e.call)] = _Site(e.call, _restores_first(sub))
                break
    return sorted(out.values(), key=lambda s: s.call.order)


def _parts_managed(model: FileModel, loop: Loop, text: str) -> bool:
    """The loop switches parts of the module back to training (``M.head.train()``):
    the author manages the parts' modes."""
    return any(c.method == "train" and (c.receiver_text or "").startswith(text + ".")
               for c in model.calls_within(loop.order, loop.end))


def _built_without_mode_layers(model: FileModel, scope: Scope, text: str) -> bool:
    """The module comes out of a same-file factory that builds a same-file
    class with no dropout or batch norm (``benchmark, model = make_parts()``)."""
    cls = factory_class(model, scope, text)
    return cls is not None and not class_has_mode_layers(model, cls)


def _lightning(model: FileModel, scope: Scope) -> bool:
    fn = model.enclosing_function(scope)
    info = model.classes.get(fn.class_name) if fn is not None and fn.class_name else None
    return info is not None and any("lightning" in b.lower() or b.endswith("Callback") for b in info.bases)


class TrainNotRestored(Rule):
    """``M.eval()`` inside a training loop (or a helper the loop calls) with no
    ``M.train()`` before ``M`` trains again in a later iteration.

    Rests on: ``torch.nn.Module.train`` / ``torch.nn.Module.eval`` ("This has
    an effect only on certain modules ... Dropout, BatchNorm"; the mode stays
    until changed) and ``torch.nn.BatchNorm2d`` (running statistics are
    updated only in training mode).
    """

    code = "TGL202"
    name = "train-not-restored"
    summary = "`eval()` inside the training loop and no `train()` before the module trains again"
    probe = "train-in-eval"
    prefilter = (("eval", "train("), ("backward", "step"))
    ast_prefilter = "switches-to-eval"  # an `m.eval()` / `m.train(False)` call
    docs = """
## What it does
Checks for a loop that puts a module in eval mode (`M.eval()` or
`M.train(False)`, in the loop body or in a same-file helper it calls, such
as a `validate()` run every epoch) and trains the same module in a later
iteration (a backward or an optimizer step after a forward through it, in
the loop or in a training helper) with no `M.train()` in between. The
finding points at the `eval()` call.

It stays silent when `M.train()` runs at the top of the loop or of the
training helper, when the evaluation helper switches back
(`M.train()`, or `was_training = M.training ... M.train(was_training)`),
when the eval is of another object (a fresh instance, a
`copy.deepcopy(M)`), when the eval is after the loop, when the loop
switches parts of the module back (`M.head.train()` or a same-file method
that calls `self.<part>.train()`), when the module is rebuilt in the loop,
when the iteration itself puts the module in eval mode before training it
(GAN phases, gradient checks in eval mode: a choice every iteration makes),
when the eval runs only in the loop's last iteration (`for i, batch in
enumerate(loader): ... if i == len(loader) - 1: M.eval()`: no later iteration
of that loop trains, and the enclosing epoch loop is judged on its own),
in PyTorch Lightning modules and callbacks (the trainer restores the mode),
for a frozen module (`M.requires_grad_(False)`, or `requires_grad = False`
on each of `M.parameters()`, never undone: a distillation teacher or a
target network takes no optimizer step, so eval mode is what it wants),
and for same-file modules without dropout or batch-norm layers, including
those a same-file factory returns (their mode changes nothing).

## Why is this bad?
A module is in training mode from construction until `eval()` and stays in
eval mode until `train()`. When validation in the epoch loop calls
`model.eval()` and `model.train()` is called only once before the loop,
every epoch after the first trains in eval mode: dropout is off (no
regularisation) and batch norm normalises with its frozen running
statistics and stops updating them. Nothing fails; the model just trains
differently from what was written (measured: 144 of 160 training forwards
ran in eval mode, batch norm updated its statistics in 16 of 160 steps;
hendrycks/ethics#5, simpletransformers#941, pytorch/tutorials#1624).

## Example
```python
model.train()
for epoch in range(epochs):
    for x, y in train_loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        val_loss = loss_fn(model(x_val), y_val).item()
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
        val_loss = loss_fn(model(x_val), y_val).item()
```

## References
- [torch.nn.Module.train](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.train)
- [torch.nn.Module.eval](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval)
- [torch.nn.BatchNorm2d](https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm2d.html) (running statistics)
- [torch.nn.Dropout](https://pytorch.org/docs/stable/generated/torch.nn.Dropout.html)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        if foreign_framework_file(model):
            return
        reported: set[int] = set()
        for loop in model.loops:
            if _lightning(model, loop.scope):
                continue
            for text, pairs in _candidates(model, loop).items():
                at, first = pairs[0]
                if not (_is_module(model, at, text) or is_module_at(model, first, first.receiver_text)) \
                        or not mode_sensitive_at(model, at, text):
                    continue
                if _parts_managed(model, loop, text) or _built_without_mode_layers(model, loop.scope, text) \
                        or frozen_module(model, text):
                    continue  # the mode of a frozen module (a distillation teacher) trains nothing
                culprit = _leaked_eval(model, loop, text, pairs)
                if culprit is None:
                    continue
                node = next((e.node for c, e in pairs if c is culprit), None)
                if node is None or id(node) in reported:
                    continue
                reported.add(id(node))
                yield Finding.from_text(node, (
                    f"`{text}` stays in eval mode for the next training iteration: this `eval()` in the training "
                    f"loop is not followed by `{text}.train()` before `{text}` trains again, so from then on dropout "
                    f"is off and batch-norm running statistics stop updating; call `{text}.train()` at the top of "
                    "the loop (or of the training helper), or switch back after evaluating"))


def _helper_restores(model: FileModel, call: Call, eval_call: Call) -> bool:
    """Whether, after ``eval_call``, the helper chain started at ``call``
    switches the module back (a later ``.train(...)`` call in the helper or in
    the function of the eval)."""
    fn = model.enclosing_function(eval_call.scope)
    spans = [(callee.order, callee.end) for callee in model.resolve_callee(call)]
    if fn is not None:
        spans.append((fn.order, fn.end))
    return any(d.method == "train" and not _switches_to_eval(d) and d.order > eval_call.order
               for lo, hi in spans for d in model.calls_within(lo, hi))


def _leaked_eval(model: FileModel, loop: Loop, text: str, pairs: list[tuple[Call, Call]]) -> Optional[Call]:
    """The call in the loop whose eval (its own, or a helper's) reaches a
    training site of ``text`` in the next iteration, or ``None``.

    A site sees what the previous iteration left when nothing before it in
    the loop body sets the mode; the last switch of the body then decides."""
    evs = [e for e in events(model, loop.scope, text) if loop.contains(e.order)]
    seen = {id(e.call) for e in evs}
    # helpers that ``events`` cannot map the module into (``validate(context)``
    # evaluating ``context.model``): their eval counts unless they switch back
    evs += [ModeEvent(c, EVAL) for c, e in pairs
            if c is not e and id(c) not in seen and not _helper_restores(model, c, e)]
    evs.sort(key=lambda e: e.order)
    if not any(e.kind == EVAL for e in evs):
        return None
    sites = _sites(model, loop, text, evs)
    if not sites:
        return None
    restoring = {id(s.call) for s in sites if s.restores}
    states = sorted([e for e in evs if e.kind in _EXPLICIT]
                    + _indirect_switches(model, loop.scope, loop.order, loop.end, text)
                    + [ModeEvent(s.call, TRAIN) for s in sites if s.restores], key=lambda e: e.order)
    rebound = [a.order for a in model.bindings_of(text.split(".")[0], loop.scope) if loop.contains(a.order)]
    for site in sites:
        if site.restores or any(order < site.call.order for order in rebound):
            continue  # a fresh module every iteration, or a helper that switches back first
        if any(e.order < site.call.order for e in states):
            continue  # the iteration sets the mode itself before training (an eval there is deliberate)
        # the mode at the site is what the previous iteration left: its last switch
        after = [e for e in states if e.order >= site.call.order and id(e.call) not in restoring]
        state = after[-1] if after else None
        if state is not None and state.kind == EVAL and not _alternative(model, state, states) \
                and id(state.call.node) not in last_iteration_only(model, loop):
            return state.call  # (an eval in the loop's last iteration only: no next iteration sees it)
    return None


def _indirect_switches(model: FileModel, scope: Scope, order: int, end: int, text: str) -> list[ModeEvent]:
    """Switches of ``text`` in ``[order, end]`` of ``scope`` that ``events``
    does not see: ``M.to(device).train()`` (a chained receiver; ``TRAIN``),
    and ``M.meth()`` where a same-file class's method ``meth`` calls
    ``self....train(...)`` (``train_custom()`` training the head; ``UNKNOWN``)."""
    out: list[ModeEvent] = []
    switching = {name for info in model.classes.values() for name, m in info.methods.items()
                 if any(d.method == "train" and (d.receiver_text or "").startswith("self")
                        for d in model.calls_within(m.order, m.end))}
    for c in model.calls_within(order, end):
        if c.scope is not scope or c.receiver is None:
            continue
        if c.method == "train" and c.receiver_text is None and not _switches_to_eval(c) \
                and dotted_name(unwrap(c.receiver)) == text:
            out.append(ModeEvent(c, TRAIN))
        elif c.receiver_text == text and c.method in switching and c.method != "train":
            out.append(ModeEvent(c, UNKNOWN))
    return out


def _alternative(model: FileModel, state: ModeEvent, states: list[ModeEvent]) -> bool:
    """Whether the eval is one branch of a choice whose other branch sets
    another mode (``model.train() if phase == "train" else model.eval()``, or
    ``if``/``else`` statements): the mode depends on the condition."""
    return any(e.kind != EVAL and (e.call.statement is state.call.statement or model.exclusive(e.call, state.call))
               for e in states)
