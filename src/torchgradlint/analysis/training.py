"""Training steps: loops whose iterations backpropagate and step an optimizer,
seen through same-file helpers (``train_step(batch)`` called in a loop)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import libcst as cst

from .literals import is_literal
from .model import Call, FileModel, Loop, Scope, names_in, nodes_under_if
from .names import dotted_name
from .torch_api import DATA_SOURCE_NAME
from .steps import Backward, OptimizerStep, backward_call, optimizer_step

_MAX_DEPTH = 3


@dataclass(frozen=True)
class StepSite:
    """An optimizer step as seen from a loop: the step call itself, or the
    call of a same-file helper that steps (``via`` is that call)."""

    step: OptimizerStep
    via: Call
    in_helper_loop: bool = False
    """True when, inside the helper chain, the step already runs in a loop
    that backpropagates (that loop is the training loop to judge, not the
    loop around ``via``)."""

    @property
    def order(self) -> int:
        """Pre-order index of the call that sits in the loop."""
        return self.via.order



def runs_backward(model: FileModel, call: Call, *, accumulating_only: bool, depth: int = 0) -> bool:
    """Whether ``call`` runs a backward, itself or through same-file helpers
    (followed up to ``_MAX_DEPTH`` calls deep). With ``accumulating_only``,
    ``torch.autograd.grad`` does not count (it does not write ``.grad``)."""
    return model.memoised(runs_backward, (id(call), accumulating_only, depth),  # the loops ask about the same calls
                          lambda: _runs_backward(model, call, accumulating_only, depth))


def _runs_backward(model: FileModel, call: Call, accumulating_only: bool, depth: int) -> bool:
    b: Optional[Backward] = backward_call(model, call)
    if b is not None and (b.accumulates or not accumulating_only):
        return True
    if depth >= _MAX_DEPTH:
        return False
    return any(
        runs_backward(model, inner, accumulating_only=accumulating_only, depth=depth + 1)
        for callee in model.resolve_callee(call) if not callee.contains(call.order)
        for inner in model.calls_within(callee.order, callee.end)
    )


def _in_training_loop(model: FileModel, call: Call) -> bool:
    loop = call.loop
    while loop is not None:
        if has_backward(model, loop.order, loop.end):
            return True
        loop = loop.parent
    return False


def _function_step_sites(model: FileModel, scope: Scope, depth: int,
                         seen: frozenset = frozenset()) -> list[tuple[OptimizerStep, bool]]:
    """Steps reached by calling ``scope``, each with whether it runs inside a
    training loop somewhere along the helper chain (memoised per file: every
    call of a helper asks)."""
    return list(model.memoised(_function_step_sites, (id(scope), depth, seen),
                               lambda: _step_sites_of(model, scope, depth, seen)))


def _step_sites_of(model: FileModel, scope: Scope, depth: int, seen: frozenset) -> list[tuple[OptimizerStep, bool]]:
    out: list[tuple[OptimizerStep, bool]] = []
    seen = seen | {id(scope)}
    for c in model.calls_within(scope.order, scope.end):
        s = optimizer_step(model, c)
        if s is not None:
            out.append((s, _in_training_loop(model, c)))
        elif depth < _MAX_DEPTH:
            for callee in model.resolve_callee(c):
                if id(callee) not in seen:
                    inner = _function_step_sites(model, callee, depth + 1, seen)
                    looped = bool(inner) and _in_training_loop(model, c)
                    out += [(st, flag or looped) for st, flag in inner]
    return out


def step_sites(model: FileModel, order: int, end: int) -> list[StepSite]:
    """Optimizer steps lexically in ``[order, end]`` or reached through a
    same-file helper called there (``in_helper_loop`` marks helper steps that
    already run inside a training loop of the helper chain)."""
    out: list[StepSite] = []
    for c in model.calls_within(order, end):
        s = optimizer_step(model, c)
        if s is not None:
            out.append(StepSite(s, c))
            continue
        for callee in model.resolve_callee(c):
            for inner, looped in _function_step_sites(model, callee, 1):
                out.append(StepSite(inner, c, looped))
    return out


def has_backward(model: FileModel, order: int, end: int) -> bool:
    """Whether ``[order, end]`` runs an accumulating backward, directly or
    through a same-file helper (``torch.autograd.grad`` does not count: it
    does not write ``.grad``)."""
    return model.memoised(has_backward, (order, end), lambda: any(
        runs_backward(model, c, accumulating_only=True) for c in model.calls_within(order, end)))


def training_loop_of(model: FileModel, site: StepSite) -> Optional[Loop]:
    """The innermost loop around a step site whose body also backpropagates."""
    loop = site.via.loop
    while loop is not None:
        if has_backward(model, loop.order, loop.end):
            return loop
        loop = loop.parent
    return None


_ITER_WRAPPERS = frozenset({"enumerate", "zip", "iter", "tqdm", "trange", "islice", "reversed", "sorted", "list",
                            "tuple", "cycle", "chain", "progress_bar", "track"})


# Tensor methods that move another dimension first: a loop over the result walks the positions (time
# steps, channels) of one tensor, not batches of a data source.
_DIMENSION_REORDERING = frozenset({"transpose", "permute", "t", "movedim", "swapaxes", "swapdims"})


def iterates_data(model: FileModel, loop: Loop) -> bool:
    """Whether ``loop`` walks batches of a data source (a data loader, a
    dataset, ``enumerate(train_loader)``, ``tqdm(loader)``...): each
    iteration is an independent step, so nothing one iteration computes is
    needed by the next. A loop over sequence positions or layers (an RNN
    unrolled by hand, ``for x_t in batch.transpose(0, 1)``) is not such a loop."""
    node = loop.node
    if not isinstance(node, cst.For):
        return False
    it: Optional[cst.BaseExpression] = node.iter
    for _ in range(4):
        if isinstance(it, cst.Call):
            text = dotted_name(it.func) or ""
            last = text.rsplit(".", 1)[-1]
            if last in _ITER_WRAPPERS and it.args:
                it = it.args[0].value
                continue
            if DATA_SOURCE_NAME.search(last) or last[:1].isupper() and "Loader" in last:
                return True
            if isinstance(it.func, cst.Attribute) and last in _DIMENSION_REORDERING:
                return False  # ``for x_t in batch_ix.transpose(0, 1)``: the positions of one batch
            if isinstance(it.func, cst.Attribute):
                it = it.func.value
                continue
            return False
        break
    text = dotted_name(it) if it is not None else None
    if text and isinstance(node.target, cst.Tuple) and it is node.iter:
        return True  # ``for x, y in pairs``: (input, target) batches
    return bool(text) and bool(DATA_SOURCE_NAME.search(text.rsplit(".", 1)[-1]))


def loop_trains(model: FileModel, loop: Loop) -> bool:
    """Whether ``loop``'s body runs a backward (directly or through a
    same-file helper), ``torch.autograd.grad`` included."""
    return model.memoised(loop_trains, id(loop), lambda: any(
        runs_backward(model, c, accumulating_only=False) for c in model.calls_within(loop.order, loop.end)))


_STORE_METHODS = frozenset({"append", "extend", "insert", "add", "push", "put", "store", "update", "appendleft"})


def step_span(model: FileModel, call: Call) -> Optional[tuple[int, int]]:
    """The pre-order span of the training step ``call`` belongs to: its
    outermost enclosing loop in its scope, or, outside any loop, its whole
    function (an ``update(batch)`` method called once per step)."""
    if call.loops:
        return call.loops[0].order, call.loops[0].end
    fn = model.enclosing_function(call.scope)
    return (fn.order, fn.end) if fn is not None else None


def feeds_backward(model: FileModel, call: Call, after_loops: bool = False, _depth: int = 0) -> bool:
    """Whether what ``call`` computes flows, later in the same iteration of
    an enclosing loop (or the same call of a loop-free update function),
    into a value that is backpropagated: a training-time
    forward (a GAN's generator sampled for the discriminator step, an RL
    rollout of the policy being trained, pseudo-labels), not an evaluation.
    With ``after_loops``: anywhere later in the same function, also after
    the loops (``for b in loader: kl += model(b)``, then ``kl.backward()``).

    Names are followed forward through bindings, through containers that
    a tainted value is stored into (``rollout.append((obs, r))``,
    ``values[step] = value``), and into same-file helpers that backpropagate
    (``train(agent, optimizer, rollout)``). With ``after_loops``, a value
    the function returns is followed to its same-file callers (DomainBed's
    ``loss_gap`` loops over the domains' batches and returns the gap that
    ``update`` backpropagates), up to three calls deep."""
    span = step_span(model, call)
    if span is None:
        return False
    start, end = span
    if after_loops:
        end = max(end, call.scope.end)
    tainted: set[str] = set()
    facts = sorted([*model.assigns_within(call.order, end), *model.calls_within(call.order, end)],
                   key=lambda f: f.order)
    for a in model.assigns_within(start, end):
        if a.statement is call.statement:
            tainted |= {t.text for t in a.targets if t.text}
    if not tainted:
        return False
    for fact in facts:
        if fact.scope is not call.scope:
            continue
        if isinstance(fact, Call):
            reads = set()
            for arg in fact.node.args:
                reads |= names_in(arg.value)
            if fact.method in _STORE_METHODS and fact.receiver_text and reads & tainted:
                tainted.add(fact.receiver_text)
            b = backward_call(model, fact)
            if b is not None and names_in(b.target) & tainted:
                return True
            if b is None and reads & tainted and runs_backward(model, fact, accumulating_only=False):
                return True  # ``train(agent, optimizer, rollout)``: a helper trains on it
        elif fact.value is not None and names_in(fact.value) & tainted:
            tainted |= {t.text for t in fact.targets if t.text}
            # ``values[step] = value``: the buffer the rollout is stored in
            tainted |= {t.container for t in fact.targets if t.kind == "subscript" and t.container}
    if not after_loops or _depth >= 3:
        return False
    if not any(r.value is not None and r.order > call.order and names_in(r.value) & tainted
               for r in model.returns_of(call.scope)):
        return False
    return any(feeds_backward(model, caller, after_loops=True, _depth=_depth + 1)
               for caller in model.callers_of(call.scope) if caller.scope is not call.scope)


def frozen_module(model: FileModel, text: str) -> bool:
    """Whether the file freezes the module ``text`` and never unfreezes it:
    ``text.requires_grad_(False)``, or a loop over ``text.parameters()``
    that sets each one's ``requires_grad = False`` (or calls
    ``requires_grad_(False)`` on it), and no ``text.requires_grad_()`` /
    ``requires_grad_(True)``. A frozen module (a distillation teacher, a
    target network) takes no optimizer update, so no training step needs
    its training mode: eval mode on it is deliberate.

    PyTorch docs: ``nn.Module.requires_grad_``
    (https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.requires_grad_)."""
    freezes = False
    for c in model.calls:
        if c.method != "requires_grad_":
            continue
        frozen = is_literal(c.arg(0, "requires_grad"), False)
        if c.receiver_text == text:
            if not frozen:
                return False
            freezes = True
        elif frozen and c.loop is not None and _iterates_parameters_of(c.loop, text, c.receiver_text):
            freezes = True
    for a in model.assigns:
        for t in a.targets:
            if t.text and t.text.endswith(".requires_grad") and a.loop is not None and is_literal(a.value, False) \
                    and _iterates_parameters_of(a.loop, text, t.text.rsplit(".", 1)[0]):
                freezes = True
    return freezes


def _iterates_parameters_of(loop: Loop, text: str, name: Optional[str]) -> bool:
    """Whether ``loop`` is ``for name in text.parameters()``."""
    node = loop.node
    if not isinstance(node, cst.For) or not isinstance(node.target, cst.Name) or node.target.value != name:
        return False
    it = node.iter
    return isinstance(it, cst.Call) and dotted_name(it.func) == f"{text}.parameters"


# Wrappers that keep a sequence's items in order (a progress bar, a materialised list).
_ORDER_KEEPING = frozenset({"tqdm", "list", "tuple", "iter", "progress_bar", "track"})


def last_iteration_only(model: FileModel, loop: Loop) -> set[int]:
    """ids of the nodes of ``loop``'s body that run only in its last
    iteration: inside an ``if`` that tests the ``enumerate`` index of the
    loop against the length of the sequence it walks (``for i, batch in
    enumerate(loader): ... if i == len(loader) - 1:``, also through a name
    bound to ``tqdm(...)``/``list(enumerate(...))``, and ``i + 1 ==
    len(loader)``). What such a branch switches, the next iteration of this
    loop never sees. Memoised per loop (:func:`~.model.nodes_under_if`)."""
    node = loop.node
    if not isinstance(node, cst.For) or not isinstance(node.target, cst.Tuple) or not node.target.elements:
        return set()
    counter = dotted_name(node.target.elements[0].value)
    sequences, enumerated = _walked_sequences(model, loop, node.iter)
    if not counter or not enumerated or not sequences:
        return set()
    return nodes_under_if(model, node, "last-iteration", lambda test: _is_last_index_test(test, counter, sequences))


def _walked_sequences(model: FileModel, loop: Loop, expr: cst.BaseExpression) -> tuple[set[str], bool]:
    """The names of the sequences ``expr`` walks, through order-keeping
    wrappers and names one binding gives where the loop starts (``pbar = tqdm(steps)``,
    ``steps = list(enumerate(loader))``), and whether an ``enumerate`` numbers
    the items."""
    names: set[str] = set()
    enumerated = False
    start = next((a for a in model.assigns_in_scope(loop.scope) if a.kind == "for" and a.node is loop.node), None)
    for _ in range(6):
        if isinstance(expr, cst.Call) and expr.args and not expr.args[0].star:
            func = (dotted_name(expr.func) or "").rsplit(".", 1)[-1]
            if func == "enumerate" and not enumerated and len(expr.args) == 1:
                enumerated = True
            elif func not in _ORDER_KEEPING:
                break
            expr = expr.args[0].value
            continue
        text = dotted_name(expr)
        if not text:
            break
        names.add(text)
        bindings = model.reaching_bindings(text, start) if start is not None else []
        if len(bindings) != 1 or bindings[0].kind != "assign" or bindings[0].unpacked or bindings[0].value is None:
            break
        expr = bindings[0].value
    return names, enumerated


def _is_last_index_test(test: cst.BaseExpression, counter: str, sequences: set[str]) -> bool:
    """``i == len(s) - 1``, ``len(s) - 1 == i``, ``i + 1 == len(s)`` or ``len(s) == i + 1``."""
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1 \
            or not isinstance(test.comparisons[0].operator, cst.Equal):
        return False
    sides = (test.left, test.comparisons[0].comparator)

    def length(e) -> bool:
        return isinstance(e, cst.Call) and dotted_name(e.func) == "len" and len(e.args) == 1 \
            and dotted_name(e.args[0].value) in sequences

    def offset(e, base) -> bool:  # ``base - 1`` / ``base + 1`` as a binary operation with the integer 1
        return isinstance(e, cst.BinaryOperation) and isinstance(e.right, cst.Integer) and e.right.value == "1" \
            and base(e.left)

    def is_counter(e) -> bool:
        return dotted_name(e) == counter

    for a, b in (sides, sides[::-1]):
        if is_counter(a) and offset(b, length) and isinstance(b.operator, cst.Subtract):
            return True
        if length(a) and offset(b, is_counter) and isinstance(b.operator, cst.Add):
            return True
    return False
