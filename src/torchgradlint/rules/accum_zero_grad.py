"""TGL003 accum-zero-grad."""

from __future__ import annotations

import re
from typing import Iterator, Optional

import libcst as cst

from ..analysis.amp_facts import CLIP_FUNCTIONS
from ..analysis.literals import bound_literals
from ..analysis.model import Call, FileModel, Loop
from ..analysis.names import dotted_name
from ..analysis.steps import call_reset, foreign_framework_file, reset_covers, resets_within
from ..analysis.training import StepSite, runs_backward, step_sites, training_loop_of
from ..analysis.tree import walk
from ..registry import Finding, Rule

#: names that say "gradient accumulation" (``accum_steps``, ``args.gradient_accumulation_steps``,
#: ``grad_acc``, ``accumulated_samples``); matched on each dotted component
_ACCUM_NAME = re.compile(r"accum|grad_acc|gradient_acc|(^|_)acc_steps?$|update_freq", re.I)
#: receivers of ``.accumulate(model)`` / ``.sync_gradients``: HF accelerate's ``Accelerator``
_ACCELERATOR = re.compile(r"(^|[._])(accelerator|accel)$", re.I)


def accumulation_gate(test: cst.BaseExpression) -> bool:
    """Whether an ``if`` test gates an optimizer step on an accumulation
    window: a modulo (``(i + 1) % k == 0``), a name of the accumulation
    vocabulary (``accum_steps``, ``gradient_accumulation_steps``) or
    accelerate's ``sync_gradients``. A guard that skips non-finite values
    (``if torch.isfinite(norm):``, ``if not skip:``) is none of these."""
    if any(isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Modulo) for node in walk(test)):
        return True
    return any(last == "sync_gradients" or _ACCUM_NAME.search(last) for last in _last_names(test))


def _last_names(node: cst.CSTNode) -> Iterator[str]:
    """The last component of every name and attribute in ``node`` (``args.grad_accum`` -> ``grad_accum``)."""
    for n in walk(node):
        if isinstance(n, (cst.Name, cst.Attribute)):
            yield (dotted_name(n) or "").rsplit(".", 1)[-1]


def _gate_suites(loop: Loop) -> dict[int, cst.If]:
    """``id(suite) -> if`` for every branch suite of an ``if``/``elif``/``else``
    inside ``loop``'s body (nested compound statements included, nested
    functions and classes excluded)."""
    out: dict[int, cst.If] = {}

    def visit(block: cst.CSTNode) -> None:
        for stmt in getattr(block, "body", ()):
            if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(stmt, cst.If):
                top: Optional[cst.CSTNode] = stmt
                while isinstance(top, cst.If):
                    out[id(top.body)] = stmt
                    visit(top.body)
                    top = top.orelse
                if isinstance(top, cst.Else):
                    out[id(top.body)] = stmt
                    visit(top.body)
                continue
            for field in ("body", "orelse", "finalbody"):
                child = getattr(stmt, field, None)
                if isinstance(child, (cst.Else, cst.Finally)):
                    child = child.body
                if isinstance(child, cst.BaseSuite):
                    visit(child)
            for handler in getattr(stmt, "handlers", ()):
                visit(handler.body)

    visit(loop.node.body)  # type: ignore[attr-defined]
    return out


def _elif_tests(stmt: cst.If, suite: cst.CSTNode) -> list[cst.BaseExpression]:
    """The tests that decide whether ``suite`` (a branch of the chain ``stmt``) runs."""
    tests: list[cst.BaseExpression] = []
    node: Optional[cst.CSTNode] = stmt
    while isinstance(node, cst.If):
        tests.append(node.test)
        if node.body is suite:
            return tests
        node = node.orelse
    return tests


def step_gate(loop: Loop, site: StepSite) -> Optional[cst.BaseSuite]:
    """The outermost branch suite inside ``loop`` that holds the step site and
    whose ``if`` chain is an :func:`accumulation_gate`; ``None`` when the step
    is not under one (it runs on every iteration, or only under other guards)."""
    suites = _gate_suites(loop)
    for block in site.via.blocks:
        stmt = suites.get(id(block))
        if stmt is not None and any(accumulation_gate(t) for t in _elif_tests(stmt, block)):
            return block  # type: ignore[return-value]
    return None


def _inside(fact, suite: cst.CSTNode) -> bool:
    """Whether ``fact`` lies in the suite ``suite`` (at any depth)."""
    return any(b is suite for b in fact.blocks)


def _wiping_resets(model: FileModel, loop: Loop, site: StepSite, reported: set[int]) -> Iterator[Call]:
    """The calls that reset, on every iteration of ``loop`` and in the step's scope, the gradients
    ``site`` steps (not a prepared optimizer's reset, not one already reported; each is marked
    reported)."""
    for reset in resets_within(model, loop.order, loop.end):
        fact = reset.fact
        if not isinstance(fact, Call) or id(fact.node) in reported or fact.scope is not site.via.scope \
                or not model.always_runs_in(loop, fact) or not reset_covers(model, reset, site.step.optimizer) \
                or (reset.target is not None and _prepared(model, reset.target)):
            continue
        reported.add(id(fact.node))
        yield fact


def _prepared(model: FileModel, text: Optional[str]) -> bool:
    """Whether ``text`` is bound to a result of ``X.prepare(...)`` (HF
    accelerate: a prepared optimizer's ``zero_grad()`` and ``step()`` do
    nothing until the accumulation window is complete)."""
    if not text:
        return False
    for a in model.assigns:
        if a.binds(text) and isinstance(a.value, cst.Call) and isinstance(a.value.func, cst.Attribute) \
                and a.value.func.attr.value == "prepare":
            return True
    return False


class AccumZeroGrad(Rule):
    """Gradient accumulation whose gradients are reset on every micro-batch.

    Rests on: ``torch.Tensor.backward`` ("this function accumulates gradients
    in the leaves"), ``torch.optim.Optimizer.zero_grad`` and
    ``torch.nn.Module.zero_grad`` (reset ``.grad`` to ``None`` or zero), and
    HF accelerate's "Gradient accumulation" guide (``accelerator.accumulate``
    skips a prepared optimizer's ``zero_grad()``, not a module's).
    """

    code = "TGL003"
    name = "accum-zero-grad"
    summary = "gradients reset every micro-batch while `step()` runs only every N (accumulation wiped)"
    probe = "discarded-gradients"
    prefilter = (("grad",), ("step", "accumulate"),
                 ("%", "accum", "Accum", "ACCUM", "sync_gradients", "update_freq", "backward"))
    needs_backward = True
    docs = """
## What it does
Checks for gradient accumulation loops that reset the gradients on every
micro-batch: a loop backpropagates on every iteration, steps the optimizer only
under an accumulation gate (`if (i + 1) % k == 0:`, a condition on an
`accum*` / `gradient_accumulation*` name, or `accelerator.sync_gradients`), and
resets the gradients that optimizer steps (`optimizer.zero_grad()`,
`model.zero_grad()`, a same-file helper that resets) on every iteration,
outside the step's branch. It checks the nested shape too (nanoGPT and most LLM
training scripts): an inner loop over the accumulation window (`for micro_step in
range(gradient_accumulation_steps):`, an iterable that names the accumulation)
backpropagates on every micro-step, the step follows that loop, and a reset of
the stepped gradients runs on every micro-step. An inner loop whose iterable
names no accumulation counts too (`for i in range(gen_iters):` around a
generator's reset and backward, its optimizer stepped once after the loop)
when it may run more than once and reads no gradient in its body. It also
checks for `model.zero_grad()` on every iteration inside `with
accelerator.accumulate(...)`.

It stays silent when the reset sits in the step's branch (before or after the
step), when the step's branch backpropagates before stepping (an actor updated
every `k` critic steps: its gradients come from that branch), or calls a helper
that does (`if it % n_d == 0: train_G()`, a generator trained every `n_d`
discriminator steps), when the reset
has its own accumulation gate (`if i % k == 0:` at the
start of a window), when the step runs on every iteration, when the step's
guard is not an accumulation gate (a skip for non-finite values such as
`if torch.isfinite(grad_norm):`), when the reset targets another optimizer,
and on `optimizer.zero_grad()` of an optimizer returned by
`accelerator.prepare(...)` (accelerate skips it inside the window), and on
`accelerator.accumulate()` in a file whose `Accelerator(...)` is built without
`gradient_accumulation_steps` (every micro-batch then syncs). In the nested shape
it stays silent on a reset before the window or after the step (nanoGPT as
written), on one under a condition inside the window (`if micro_step == 0:`), and
on an inner loop that names no accumulation and keeps each pass's gradients
apart (a per-sample loop that reads `.grad`, clips or calls `autograd.grad`) or
runs once (`range(1)`, `range(GEN_ITERS)` with `GEN_ITERS = 1`).

## Why is this bad?
`backward()` adds into `.grad`; accumulation relies on that sum surviving until
`step()`. A reset on every micro-batch throws away all but the last one, so
the optimizer sees one micro-batch divided by the accumulation count: the
effective batch shrinks to a micro-batch and the learning rate by the
accumulation factor. Nothing fails and the loss still falls. Measured (torch
2.13, CPU, 4 micro-batches of 16): the gradient reaching `step()` has 0.405x
the intended norm (cosine 0.88) and the full-data MSE after one epoch is 9.39
instead of 7.77 (openWakeWord issue #316, opacus #93).

## Example
```python
for i, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = criterion(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
```

## Use instead
```python
for i, (x, y) in enumerate(loader):
    loss = criterion(model(x), y) / accum_steps
    loss.backward()
    if (i + 1) % accum_steps == 0:
        optimizer.step()
        optimizer.zero_grad()
```

## References
- [torch.Tensor.backward](https://pytorch.org/docs/stable/generated/torch.Tensor.backward.html)
- [torch.optim.Optimizer.zero_grad](https://pytorch.org/docs/stable/generated/torch.optim.Optimizer.zero_grad.html)
- [torch.nn.Module.zero_grad](https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.zero_grad)
- [Zeroing out gradients in PyTorch](https://pytorch.org/tutorials/recipes/recipes/zeroing_out_gradients.html)
- [accelerate: gradient accumulation](https://huggingface.co/docs/accelerate/usage_guides/gradient_accumulation)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        if foreign_framework_file(model):
            return
        reported: set[int] = set()
        for site in step_sites(model, model.module_scope.order, model.module_scope.end):
            if site.in_helper_loop:
                continue
            loop = training_loop_of(model, site)
            if loop is None:
                continue
            yield from self._micro_step_resets(model, loop, site, reported)
            gate = step_gate(loop, site)
            if gate is None or not self._backward_outside(model, loop, gate, site.via) \
                    or self._backward_in_branch(model, loop, gate, site.via) \
                    or (site.via is not site.step.call and runs_backward(model, site.via, accumulating_only=True)):
                continue  # (or the gated helper backpropagates its own loss: ``train_G()`` every ``n_d`` steps)
            for fact in _wiping_resets(model, loop, site, reported):
                opt = site.step.optimizer or "the optimizer"
                yield Finding(fact.node, f"`{fact.func_text}()` resets gradients on every micro-batch while "
                                         f"`{opt}` steps only under an accumulation gate",
                              detail="All but the last micro-batch's gradients are thrown away before the step, "
                                     "so the update sees one micro-batch (divided by the accumulation count); "
                                     "move the reset into the step's branch, after the step.")
        yield from self._accelerate_module_resets(model, reported)

    @staticmethod
    def _micro_step_resets(model: FileModel, loop: Loop, site: StepSite, reported: set[int]) -> Iterator[Finding]:
        """The nested shape (nanoGPT, most LLM training scripts): an inner loop over the accumulation
        window (``for micro_step in range(gradient_accumulation_steps):``) backpropagates on every
        iteration, the step follows that loop, and a reset of the stepped gradients runs on every
        iteration of the inner loop. A loop whose iterable names the accumulation vocabulary is a
        window; another loop is one when it may repeat and reads no gradient
        (:func:`_repeats_without_reading_gradients`: a per-sample loop that reads each sample's
        ``.grad`` is not)."""
        via = site.via
        for inner in model.loops:
            if inner.scope is not via.scope or not isinstance(inner.node, cst.For) or inner is loop \
                    or not loop.contains(inner.order) or inner.contains(via.order) or inner.end > via.order:
                continue
            named = any(_ACCUM_NAME.search(last) for last in _last_names(inner.node.iter))
            if not named and not _repeats_without_reading_gradients(model, inner):
                continue
            if not any(c.scope is via.scope and model.always_runs_in(inner, c)
                       and runs_backward(model, c, accumulating_only=True)
                       for c in model.calls_within(inner.order, inner.end)):
                continue
            if not named and step_sites(model, inner.order, inner.end):
                continue  # the loop steps itself (through a helper): its passes are steps, not micro-steps
            for fact in _wiping_resets(model, inner, site, reported):
                if not named and fact.method != "zero_grad":
                    continue  # a helper that resets may do so under its own accumulation gate
                yield _micro_step_finding(fact, site.step.optimizer or "the optimizer", named)

    @staticmethod
    def _backward_outside(model: FileModel, loop: Loop, gate: cst.CSTNode, via: Call) -> bool:
        """Whether the loop backpropagates outside the step's gated branch
        (on the iterations that do not step: the micro-batches)."""
        return any(c.scope is via.scope and not _inside(c, gate)
                   and runs_backward(model, c, accumulating_only=True)
                   for c in model.calls_within(loop.order, loop.end))

    @staticmethod
    def _backward_in_branch(model: FileModel, loop: Loop, gate: cst.CSTNode, via: Call) -> bool:
        """Whether the step's branch backpropagates before the step: its
        gradients come from that branch (an actor updated every ``k`` critic
        steps, a generator trained every ``n_critic`` iterations), not from
        micro-batches of earlier iterations."""
        return any(c.scope is via.scope and c.order < via.order and _inside(c, gate)
                   and runs_backward(model, c, accumulating_only=True)
                   for c in model.calls_within(loop.order, loop.end))

    @staticmethod
    def _accelerate_module_resets(model: FileModel, reported: set[int]) -> Iterator[Finding]:
        """``M.zero_grad()`` (a module, not a prepared optimizer) on every
        iteration inside ``with accelerator.accumulate(...)``."""
        if _accelerators_never_accumulate(model):
            return
        for call in model.calls:
            if call.method != "accumulate" or not _ACCELERATOR.search(call.receiver_text or ""):
                continue
            stmt = call.statement
            if not isinstance(stmt, cst.With) or not any(item.item is call.node for item in stmt.items):
                continue
            body = stmt.body
            inner = [c for c in model.calls_within(call.order, call.order + 10**9) if c.scope is call.scope
                     and any(b is body for b in c.blocks)]
            if not any(runs_backward(model, c, accumulating_only=True) for c in inner):
                continue
            for c in inner:
                if c.method != "zero_grad" or id(c.node) in reported:
                    continue
                index = next(i for i, b in enumerate(c.blocks) if b is body)
                if any(id(b) not in model.with_bodies for b in c.blocks[index + 1:]):
                    continue  # under a condition inside the window (``if accelerator.sync_gradients:``)
                reset = call_reset(model, c)
                if reset is None or reset.module is None:
                    continue  # an optimizer's reset: accelerate skips it inside the window
                reported.add(id(c.node))
                yield Finding(c.node, f"`{c.func_text}()` inside `accelerator.accumulate()` resets the "
                                      "gradients on every micro-batch",
                              detail="Accelerate skips a prepared optimizer's `zero_grad()` until the "
                                     "accumulation window is complete, but not a module's: every micro-batch "
                                     "but the last is thrown away; call `optimizer.zero_grad()` instead.")


def _micro_step_finding(fact: Call, opt: str, named: bool) -> Finding:
    """The finding for a reset on every pass of an inner loop the step follows: an accumulation
    window (``named``: its iterable names the accumulation) or another loop that repeats."""
    if named:
        return Finding(fact.node, f"`{fact.func_text}()` resets gradients on every micro-step of the "
                                  f"accumulation loop while `{opt}` steps after it",
                       detail="All but the last micro-step's gradients are thrown away before the step, so the "
                              "update sees one micro-batch (divided by the accumulation count); reset once per "
                              "step, before the accumulation loop or after the step.")
    return Finding(fact.node, f"`{fact.func_text}()` resets gradients on every iteration of this loop while "
                              f"`{opt}` steps once after it",
                   detail="Each iteration's backward adds gradients that the next iteration's reset throws "
                          "away, so the step sees only the last iteration's; reset once, before the loop, or "
                          "step inside it.")


def _repeats_without_reading_gradients(model: FileModel, loop: Loop) -> bool:
    """Whether an inner loop that names no accumulation (``for i in
    range(gen_iters):``) still sums its backwards for the step after it: it
    may run more than once (its iterable is no ``range`` of a literal 1, nor
    of a name bound only to one), and nothing in its body reads gradients
    (``.grad``, ``autograd.grad``, gradient clipping, a same-file function
    whose code reads ``.grad``). A per-sample loop that copies each sample's
    ``.grad`` before the next reset keeps the iterations apart on purpose."""
    it = loop.node.iter  # type: ignore[attr-defined]
    if isinstance(it, cst.Call) and dotted_name(it.func) == "range" and len(it.args) == 1 \
            and _at_most_one(model, it.args[0].value):
        return False
    body = loop.node.body  # type: ignore[attr-defined]
    for node in walk(body):
        if isinstance(node, cst.Attribute) and node.attr.value == "grad":
            return False
    for c in model.calls_within(loop.order, loop.end):
        qn = c.qualname or ""
        if qn == "torch.autograd.grad" or qn in CLIP_FUNCTIONS or c.method in ("clip_grad_norm_", "clip_grad_value_"):
            return False
        for callee in model.resolve_callee(c):
            if ".grad" in model.module.code_for_node(callee.node):
                return False
    return True


def _at_most_one(model: FileModel, node: cst.BaseExpression) -> bool:
    """Whether ``node`` is an integer literal <= 1, or a name every binding of which in the file is that literal."""
    values = bound_literals(model, node)
    return values is not None and all(type(v) is int and v <= 1 for v in values)


def _accelerators_never_accumulate(model: FileModel) -> bool:
    """Whether the file builds its ``accelerate.Accelerator`` objects and none
    is given ``gradient_accumulation_steps`` (or a plugin, or ``**kwargs``):
    then ``accumulate()`` syncs on every micro-batch and a module reset
    inside it wipes nothing."""
    built = [c for c in model.calls if (c.qualname or "") in ("accelerate.Accelerator",
                                                              "accelerate.accelerator.Accelerator")]
    return bool(built) and not any(
        a.star or (a.keyword is not None and a.keyword.value.startswith("gradient_accumulation"))
        for c in built for a in c.node.args)
