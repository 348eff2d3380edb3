"""TGL101 loss-kept-with-graph."""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from typing import Iterator, Optional

import libcst as cst

from ..analysis.model import Assign, Call, FileModel, GradMode, _Located, names_in, unwrap, walk
from ..analysis.names import dotted_name
from ..analysis.provenance import (
    backpropagated_names,
    freed_by_backward,
    is_backward_target,
    is_scalar_loss,
    loss_like,
    provenance,
    returned_names,
)
from ..analysis.reads import read_only_detached
from ..analysis.training import iterates_data, loop_trains
from ..analysis.steps import backward_call, optimizer_step
from ..analysis.meters import METER_CLASS_NAME, METER_UPDATE, update_accumulates
from ..analysis.torch_api import CONCAT_FUNCTIONS, MODULE_RETURNING_METHODS, STORE_METHODS
from ..registry import Finding, Rule

_CONTAINER_CTORS = frozenset({"list", "dict", "collections.deque", "collections.defaultdict",
                              "collections.OrderedDict", "deque", "defaultdict", "OrderedDict"})
# Uses of a list of floats that work exactly like uses of a list of tensors.
_FLOAT_SAFE_FUNCS = frozenset({"len", "sum", "print", "min", "max", "sorted", "statistics.mean", "numpy.mean",
                               "np.mean", "math.fsum", "enumerate", "zip", "list", "round"})


@dataclass
class _Store:
    fact: _Located
    node: cst.CSTNode  # reported node
    container: str
    values: list[cst.BaseExpression]
    kind: str  # "append" | "accumulate" | "subscript"
    target: Optional[cst.Subscript] = None  # the subscript stored into, when the statement has several targets
    siblings: tuple[str, ...] = ()  # names the same statement binds to the value (``preds[i] = logits = ...``)


def _is_container_value(model: FileModel, node: Optional[cst.BaseExpression]) -> bool:
    if isinstance(node, (cst.List, cst.Dict, cst.ListComp, cst.DictComp)):
        return True
    if isinstance(node, cst.Call):
        qn = model.qualname(node.func)
        return qn in _CONTAINER_CTORS
    return False


#: torch factories of a fresh buffer: ``preds = torch.zeros(n, k)`` then ``preds[idx] = model(x)``
_BUFFER_FACTORIES = frozenset({"torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.zeros_like",
                               "torch.ones_like", "torch.empty_like", "torch.full_like", "torch.Tensor",
                               "torch.FloatTensor"})


def _buffer_tensor(model: FileModel, node: Optional[cst.BaseExpression]) -> bool:
    """Whether ``node`` makes a fresh tensor to fill by index (``torch.zeros(out_shape)``,
    through ``.to(device)``-style calls): a value stored into it with a graph attaches the
    whole buffer to that graph (``CopySlices``), and it keeps every stored step's graph."""
    inner = unwrap(node, MODULE_RETURNING_METHODS) if node is not None else None
    return isinstance(inner, cst.Call) and (model.qualname(inner.func) or "") in _BUFFER_FACTORIES \
        and not any(a.keyword is not None and a.keyword.value == "requires_grad" for a in inner.args)


def _reset_before(model: FileModel, s: "_Store") -> Optional[Assign]:
    """The binding of the store's container that certainly runs before the
    store: the latest dominating one, looking past bindings in branches that
    only accumulate into it (``self.loss = zeros(1)`` at the top of the
    iteration, then ``self.loss += a`` in an ``if`` and ``self.loss += b`` in
    its ``else``)."""
    before = [a for a in model.bindings_of(s.container, s.fact.scope)
              if a.order < s.fact.order and a.statement is not s.fact.statement]
    for i in range(len(before) - 1, -1, -1):
        b = before[i]
        if model.certainly_reaches(b, s.fact):
            return b
        if b.kind != "augassign":
            return None  # a branch rebinds it to something else
    return None


def _keyed_container(receiver: "cst.BaseExpression | None") -> "str | None":
    """``history`` for ``history['loss']`` / ``history[0]``: a list held in a
    dict (or list) under a constant key is stored into through its holder
    (``collect['cost'].append(cost)``)."""
    if not isinstance(receiver, cst.Subscript) or len(receiver.slice) != 1:
        return None
    key = receiver.slice[0].slice
    if not isinstance(key, cst.Index) or not isinstance(key.value, (cst.SimpleString, cst.Integer)):
        return None
    return dotted_name(receiver.value)


def _meter_value(model: FileModel, c: Call) -> Optional[cst.BaseExpression]:
    """The value ``c`` adds into a running-average meter's sum:
    ``losses.update(loss, n)`` where every binding of ``losses`` that may
    reach the call constructs one class, and that class is a meter
    (:func:`~torchgradlint.analysis.meters.update_accumulates`): a class of
    the file or, through the project index, of the project; a class from
    outside the project by its name (``AverageMeter``)."""
    text = c.receiver_text
    value = c.arg(0, "val")
    if c.method != METER_UPDATE or not text or value is None or any(a.star for a in c.node.args):
        return None
    bindings = model.reaching_bindings(text, c) or [a for a in model.assigns if a.binds(text)]
    if not bindings or not all(a.kind in ("assign", "annassign") and isinstance(a.value, cst.Call) for a in bindings):
        return None
    funcs = {dotted_name(a.value.func) for a in bindings}  # type: ignore[union-attr]
    if len(funcs) != 1:
        return None
    name = funcs.pop() or ""
    info = model.classes.get(name)
    if info is not None:
        return value if _class_is_meter(model, info) else None
    project = model.project
    found = project.meter(model.names.qualify(name) or name) if project is not None and name else None
    if found is None:
        found = bool(METER_CLASS_NAME.search(name.rsplit(".", 1)[-1]))
    return value if found else None


def _class_is_meter(model: FileModel, info) -> bool:
    """:func:`~torchgradlint.analysis.meters.update_accumulates` of a class of
    the file (read with Python's ``ast``), memoised per class."""
    key = ("meter", id(info.node))
    if key not in model.memo:
        try:
            node = ast.parse(textwrap.dedent(model.module.code_for_node(info.node))).body[0]
        except (SyntaxError, IndexError):
            node = None
        model.memo[key] = isinstance(node, ast.ClassDef) and update_accumulates(node)
    return bool(model.memo[key])


def _item_of(model: FileModel, value: cst.BaseExpression) -> str:
    """How to write the accumulated value in the suggested ``.item()``: its name, a short
    expression in parentheses (``(loss / len(loader))``), else ``x``."""
    name = dotted_name(value)
    if name:
        return name
    code = model.module.code_for_node(value)
    return f"({code})" if len(code) <= 30 and "\n" not in code else "x"


class LossKeptWithGraph(Rule):
    """A graph-attached tensor is stored across iterations.

    Rests on: autograd mechanics ("Saved tensors"; a graph is freed when no
    tensor references it), ``torch.Tensor.item``, ``torch.Tensor.detach``, and
    the PyTorch FAQ "My model reports cuda runtime error(2): out of memory"
    (accumulating history across the training loop).
    """

    code = "TGL101"
    name = "loss-kept-with-graph"
    summary = "graph-attached tensor stored across loop iterations"
    probe = "retained-graph"
    fix_availability = "sometimes"  # `loss` -> `loss.item()` where the container takes floats
    prefilter = (("append", "extend", "insert", "+", "[", "update"),)
    # check(): a finding needs grad mode ENABLED at the store, or UNKNOWN with
    # the stored name backpropagated in the same scope.
    needs_grad_evidence = True
    ast_prefilter = "stores-with-grad-enabled"  # a lasting store where grad mode is known enabled
    docs = """
## What it does
Checks for graph-attached tensors (losses, model outputs, anything computed
from them with grad enabled) stored across loop iterations:
`losses.append(loss)`, `losses.extend([loss])`, `total += loss`,
`total = total + loss`, `history[step] = loss`, into a container or
accumulator bound outside the loop or on `self`; and
`losses.update(loss, n)` on a running-average meter bound there (the
ImageNet example's `AverageMeter`, whose `update` adds its argument into a
running sum: a class of the file or of the project whose `update` does
`self.sum += val * n`, or a class from elsewhere named like the idiom's,
`AverageMeter`/`AvgMeter`). A list filled in any loop (an environment
rollout's steps, too) and then read only to detach every element
(`torch.cat(values).detach()`, `[v.detach() for v in values]`,
`torch.stack(values).mean().item()`) is flagged as well: each step's graph
was kept until the loop ended for nothing. A `torch.distributions` object's
`log_prob`, `entropy` and `rsample` hold the graph of its parameters.

## Why is this bad?
A tensor keeps its whole autograd graph alive. When `backward()` runs every
step, each stored loss still holds its graph's nodes (a few KB per step);
when it does not (an evaluation loop without `torch.no_grad()`), every
activation saved for backward stays alive too: memory grows linearly with the
number of steps until the process runs out of memory. `total += loss` also
chains every step's graph into one ever-growing graph.

Storing `loss.item()`, `loss.detach()` or `float(loss)`, storing under
`torch.no_grad()`/`torch.inference_mode()`, and a list or sum that is later
backpropagated on purpose (`torch.stack(losses).sum().backward()`, REINFORCE's
`-torch.stack(log_probs).sum()`) are not flagged, nor are the outputs of an RNN
unrolled by hand over sequence positions and used as they are.

## Example
```python
losses = []
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss)
```

## Use instead
```python
losses = []
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
```

## Fix safety
The fix (`loss` -> `loss.item()`) is offered only when the stored value is a
scalar loss and the container or accumulator is used only in ways that work
the same with Python floats. `.item()` synchronises with the device once per
step.

## References
- [Autograd mechanics: saved tensors](https://pytorch.org/docs/stable/notes/autograd.html#saved-tensors)
- [FAQ: accumulating history across your training loop](https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory)
- [torch.Tensor.item](https://pytorch.org/docs/stable/generated/torch.Tensor.item.html)
- [torch.Tensor.detach](https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html)
"""

    # -- store sites ---------------------------------------------------------------
    def _stores(self, model: FileModel) -> Iterator[_Store]:
        for c in model.calls:
            container = c.receiver_text or _keyed_container(c.receiver)
            if c.method in STORE_METHODS and container:
                v = c.arg(STORE_METHODS[c.method])
                if v is None:
                    continue
                if c.method == "extend":
                    if not isinstance(v, (cst.List, cst.Tuple)):
                        continue
                    values = [e.value for e in v.elements if isinstance(e, cst.Element)]
                else:
                    values = [v]
                yield _Store(c, c.node, container, values, "append")
            elif c.method == METER_UPDATE:
                v = _meter_value(model, c)
                if v is not None:
                    yield _Store(c, c.node, c.receiver_text, [v], "accumulate")
        for a in model.assigns:
            if a.value is None or a.unpacked:
                continue
            if len(a.targets) != 1:  # ``preds[idx] = logits = model(x)``: each subscript target stores the value
                names = tuple(t.text for t in a.targets if t.kind == "name" and t.text)
                for t in a.targets:
                    if a.kind == "assign" and t.kind == "subscript" and t.container and isinstance(t.node, cst.Subscript):
                        yield _Store(a, a.node, t.container, [a.value], "subscript", t.node, names)
                continue
            t = a.targets[0]
            if a.kind == "augassign" and a.op == "+=" and t.text:
                if isinstance(a.value, (cst.List, cst.Tuple)):
                    values = [e.value for e in a.value.elements if isinstance(e, cst.Element)]
                    yield _Store(a, a.node, t.text, values, "append")
                else:
                    yield _Store(a, a.node, t.text, [a.value], "accumulate")
            elif a.kind == "assign" and t.text and isinstance(a.value, cst.BinaryOperation) \
                    and isinstance(a.value.operator, cst.Add):
                left, right = a.value.left, a.value.right
                if dotted_name(left) == t.text:
                    yield _Store(a, a.node, t.text, [right], "accumulate")
                elif dotted_name(right) == t.text:
                    yield _Store(a, a.node, t.text, [left], "accumulate")
            elif a.kind == "assign" and t.text and isinstance(a.value, cst.Call) \
                    and (model.qualname(a.value.func) or "") in CONCAT_FUNCTIONS and a.value.args \
                    and isinstance(a.value.args[0].value, (cst.List, cst.Tuple)):
                parts = [e.value for e in a.value.args[0].value.elements if isinstance(e, cst.Element)]
                if any(dotted_name(p) == t.text for p in parts):
                    yield _Store(a, a.node, t.text, [p for p in parts if dotted_name(p) != t.text], "accumulate")
            elif a.kind == "assign" and t.kind == "subscript" and t.container and isinstance(t.node, cst.Subscript):
                yield _Store(a, a.node, t.container, [a.value], "subscript")

    def _persists(self, model: FileModel, s: _Store) -> bool:
        """Whether the container outlives one iteration of the innermost loop."""
        if s.container.startswith("self."):
            loop = s.fact.loop
            must = _reset_before(model, s)
            if must is not None and must is not s.fact and (
                    loop.contains(must.order) if loop is not None else must.kind in ("assign", "annassign")):
                # ``self.loss = zeros(1)`` at the top of every iteration (or of
                # the step method): reset before the store
                return False
            if s.kind == "accumulate":
                return True
            return any(a.binds(s.container) and _is_container_value(model, a.value) for a in model.assigns)
        loop = s.fact.loop
        if loop is None:
            return False
        must = model.reaching_binding(s.container, s.fact)
        if must is not None and loop.contains(must.order):
            return False  # reset at every iteration before the store
        reaching = model.reaching_bindings(s.container, s.fact)
        outside = [b for b in reaching if b.order < loop.order]
        if s.kind == "accumulate":
            return bool(outside) or any(loop.contains(b.order) for b in reaching) or (
                isinstance(s.fact, Assign) and s.fact.kind == "augassign")
        if not outside or any(loop.contains(b.order) and b is not s.fact for b in reaching):
            return False  # the container is (re)built inside the loop
        last = outside[-1]
        if last.kind not in ("assign", "annassign") or not (
                _is_container_value(model, last.value) or s.kind == "subscript" and _buffer_tensor(model, last.value)):
            return False
        if s.kind == "subscript":
            return self._key_varies(model, s)
        return True

    def _key_varies(self, model: FileModel, s: _Store) -> bool:
        assert isinstance(s.fact, Assign)
        sub = s.target or s.fact.targets[0].node
        assert isinstance(sub, cst.Subscript)
        keys: set[str] = set()
        for el in sub.slice:
            keys |= names_in(el.slice)
        if not keys:
            return False
        loop = s.fact.loop
        assert loop is not None
        return any(any(b.binds(k) and loop.contains(b.order) or (b.kind == "for" and b.node is loop.node and b.binds(k))
                       for b in model.bindings_of(k, s.fact.scope)) for k in keys)

    @staticmethod
    def _loop_over_callables(model: FileModel, s: _Store) -> bool:
        """``for model in models: outs.append(model(x))``: the loop walks
        modules (an ensemble, layers), not steps, so the list stays bounded."""
        loop = s.fact.loop
        if loop is None or not isinstance(loop.node, cst.For):
            return False
        targets: set[str] = set()
        for b in model.assigns:
            if b.kind == "for" and b.node is loop.node:
                targets |= {t.text for t in b.targets if t.text}
        called = {dotted_name(n.func) for v in s.values for n in walk(v) if isinstance(n, cst.Call)}
        return bool(targets & called)

    @staticmethod
    def _result_discarded(model: FileModel, scope) -> bool:
        """Whether the function ``scope`` has same-file callers and none of
        them backpropagates what it returns (a returned container may be
        backpropagated on purpose by its caller)."""
        callers = model.callers_of(scope)
        if not callers:
            return False
        for c in callers:
            names: set[str] = set()
            for a in model.assigns_in_scope(c.scope):
                if a.statement is c.statement:
                    names |= {t.text for t in a.targets if t.text}
            if names & backpropagated_names(model, c.scope):
                return False
            for other in model.calls_in_scope(c.scope):
                bw = backward_call(model, other)
                if bw is not None and bw.target is not None and any(n is c.node for n in walk(bw.target)):
                    return False
        return True

    @staticmethod
    def _within_one_step(model: FileModel, s: _Store) -> bool:
        """Whether the container lives for one optimizer step at most: it is
        rebound in the same function before the store's loop (at the top of
        each outer iteration, or of each call), and an optimizer step follows
        that loop before the container is rebound again (gradient
        accumulation over micro-batches: ``outputs = []``, ``for chunk in
        chunks: ...; outputs.append(out); loss.backward()``, then
        ``optimizer.step()``), or it is rebound in the store's loop after an
        optimizer step in the same block or one nested in it (``running_loss += loss``
        each micro-batch, ``if (i + 1) % accum == 0: optimizer.step(); ...;
        running_loss = 0``, as torchtune's recipes write it)."""
        loop = s.fact.loop
        if loop is None or s.container.startswith("self."):
            return False
        for b in model.bindings_of(s.container, s.fact.scope):
            if b.kind in ("assign", "annassign") and loop.contains(b.order) and b.order > s.fact.order and any(
                    optimizer_step(model, c) is not None and b.blocks and any(x is b.blocks[-1] for x in c.blocks)
                    for c in model.calls_within(s.fact.order, b.order)):
                return True
        bound = [b for b in model.reaching_bindings(s.container, s.fact) if b.order < loop.order]
        if not bound or any(b.kind == "param" for b in bound):
            return False
        last = max(bound, key=lambda b: b.order)
        if last.scope is not s.fact.scope or last.scope is model.module_scope:
            return False
        outer = next((lp for lp in reversed(s.fact.loops) if lp is not loop and lp.contains(last.order)), None)
        if outer is None and any(lp.order < last.order for lp in s.fact.loops):
            return False
        if any(lp is not loop and not lp.contains(last.order) for lp in s.fact.loops):
            return False  # the container outlives a loop around the store's loop
        limit = outer.end if outer is not None else s.fact.scope.end
        return any(optimizer_step(model, c) is not None for c in model.calls_within(loop.end + 1, limit))

    @classmethod
    def _freed_in_step(cls, model: FileModel, value: cst.BaseExpression, s: _Store) -> bool:
        """Whether a backward of the step frees the saved tensors of
        ``value``'s graph: it is backpropagated, or its graph's, or it is an
        input of the loss a backward in the loop backpropagates, or it is
        arithmetic on such values and values that hold no graph
        (``class_loss * num_tokens``: only the product's node is left)."""
        if isinstance(value, (cst.BinaryOperation, cst.UnaryOperation)):
            parts = [value.left, value.right] if isinstance(value, cst.BinaryOperation) else [value.expression]
            return all(cls._freed_in_step(model, p, s) or provenance(model, p, s.fact).detached for p in parts)
        return freed_by_backward(model, value, s.fact) or is_backward_target(model, value, s.fact) \
            or cls._loss_input_in_loop(model, value, s)

    @staticmethod
    def _loss_input_in_loop(model: FileModel, value: cst.BaseExpression, s: _Store) -> bool:
        """Whether the name ``value`` is an argument of the call that computes
        what a backward in the store's loop backpropagates (``loss =
        loss_fn(output_chunk, y)`` then ``loss.backward()``): that backward
        frees the saved tensors of ``value``'s graph too."""
        text = dotted_name(value)
        loop = s.fact.loop
        if not text or loop is None:
            return False
        for c in model.calls_within(loop.order, loop.end):
            b = backward_call(model, c)
            target = dotted_name(b.target) if b is not None and b.accumulates else None
            binding = model.reaching_binding(target, c) if target else None
            calls = [n for n in walk(binding.value) if isinstance(n, cst.Call)] \
                if binding is not None and binding.value is not None else []
            if any(dotted_name(a.value) == text for call in calls for a in call.args):
                return True  # ``loss = loss_fn(output_chunk, target) / k``
        return False

    @staticmethod
    def _step_loop(model: FileModel, s: _Store) -> bool:
        """Whether the store's loop iterates over steps whose graphs are
        independent: it runs a backward, or it walks batches of a data
        source (an evaluation loop) — among the loops the container outlives
        (not one it is rebuilt in). A loop over sequence positions without
        a backward is a forward computation (an RNN unrolled by hand) whose
        collected outputs are the result, not a leak. Stores into ``self``
        attributes outlive every loop."""
        loop = s.fact.loop
        if loop is None or s.container.startswith("self."):
            return True
        # Only loops the container outlives count: one rebuilt at the top of
        # every outer iteration is bounded by the inner loop's length.
        bound = [b.order for b in model.reaching_bindings(s.container, s.fact) if b.order < loop.order]
        since = max(bound) if bound else -1
        return any(loop_trains(model, outer) or iterates_data(model, outer)
                   for outer in s.fact.loops if not outer.contains(since))

    @staticmethod
    def _detached_after_loop(model: FileModel, s: _Store) -> bool:
        """Whether the store appends into a list bound empty in the same
        function before the store's loop, and every later read of that list
        detaches all of its elements (``torch.cat(values).detach()``): each
        step's graph is kept until the loop ends and then dropped unused, so
        the loop's memory grows with its length for nothing (a PPO rollout
        run with grad enabled). This holds whatever the loop walks (an
        environment's steps), unlike :meth:`_step_loop`."""
        loop = s.fact.loop
        if loop is None or s.kind != "append" or s.container.startswith("self.") or "." in s.container:
            return False
        bound = [b for b in model.reaching_bindings(s.container, s.fact) if b.order < loop.order]
        if len(bound) != 1 or bound[0].scope is not s.fact.scope or bound[0].kind != "assign" \
                or not isinstance(bound[0].value, cst.List) or bound[0].value.elements:
            return False
        stores = {id(f.statement) for f in model.calls_in_scope(s.fact.scope)
                  if f.receiver_text == s.container and f.method in STORE_METHODS}
        return read_only_detached(model, bound[0], s.container, stores)

    # -- fix ------------------------------------------------------------------------
    def _fix(self, model: FileModel, s: _Store, value: cst.BaseExpression):
        if not isinstance(value, cst.Name) or s.kind == "subscript" or s.container.startswith("self."):
            return None
        if not is_scalar_loss(model, value, s.fact):
            return None
        scope = s.fact.scope
        if s.container in returned_names(model, scope):
            return None
        for c in model.calls_in_scope(scope):
            if c is s.fact:
                continue
            if c.receiver is not None and c.receiver_text != s.container and s.container in names_in(c.receiver):
                return None
            if c.receiver_text == s.container:
                if s.kind == "accumulate" or c.method not in ("append", "extend", "clear", "insert", "appendleft"):
                    return None
                continue
            arg_names: set[str] = set()
            for a in c.node.args:
                arg_names |= names_in(a.value)
            if s.container in arg_names and (c.qualname or "") not in _FLOAT_SAFE_FUNCS:
                return None
        for a in model.assigns_in_scope(scope):
            if a is s.fact or a.value is None or a.kind == "for":
                continue
            if s.container in names_in(a.value) and not a.binds(s.container):
                return None
        new = cst.Call(func=cst.Attribute(value=value, attr=cst.Name("item")))
        return (value, new)

    # -- check ----------------------------------------------------------------------
    def check(self, model: FileModel) -> Iterator[Finding]:
        reported: dict[int, set[str]] = {}
        for s, finding in self._findings(model):
            # A store of a value read from an already reported container or
            # accumulator (``history.append(running_loss / n)``) has the same
            # root cause: report the root only.
            root = reported.setdefault(id(s.fact.scope), set())
            if any(names_in(v) & root for v in s.values):
                continue
            root.add(s.container)
            yield finding

    def _findings(self, model: FileModel) -> Iterator[tuple[_Store, Finding]]:
        stores = sorted(self._stores(model), key=lambda st: st.fact.order)
        for s in stores:
            scope = s.fact.scope
            mode = model.grad_mode(s.fact)
            if mode is GradMode.DISABLED:
                continue
            if not self._persists(model, s) or self._loop_over_callables(model, s):
                continue
            # every read of the list detaches it: no backward goes through it, whatever the loop walks
            dropped = self._detached_after_loop(model, s)
            if not dropped:
                if s.container in backpropagated_names(model, scope):  # memoised per file
                    continue
                if s.container in returned_names(model, scope) and not self._result_discarded(model, scope) \
                        and not all(freed_by_backward(model, v, s.fact) for v in s.values):
                    continue  # the caller may backpropagate the returned container on purpose
                if s.container.startswith("self.") and any(
                        s.container in backpropagated_names(model, sc) for sc in model.scopes):
                    continue
                if not self._step_loop(model, s):
                    continue
            if self._within_one_step(model, s) and all(self._freed_in_step(model, v, s) for v in s.values):
                continue  # micro-batches of one optimizer step, each backpropagated: nothing outlives the step
            for value in s.values:
                p = provenance(model, value, s.fact)
                if not p.attached or not p.sources:  # a bare leaf holds no graph
                    continue
                if p.weak and not loss_like(model, value, s.fact):
                    continue  # an unknown callee's result: only a loss-like value is evidence
                shown = model.module.code_for_node(value)
                if len(shown) > 30:
                    shown = "the stored tensor"
                else:
                    shown = f"`{shown}`"
                scalar = is_scalar_loss(model, value, s.fact)
                # A value already backpropagated in the iteration has had its
                # saved tensors freed: only the graph's nodes are kept.
                freed = freed_by_backward(model, value, s.fact) or isinstance(value, cst.BinaryOperation) and any(
                    freed_by_backward(model, side, s.fact) for side in (value.left, value.right)) or any(
                    self._loss_input_in_loop(model, cst.Name(n), s) for n in s.siblings) \
                    or self._loss_input_in_loop(model, value, s)  # ``loss / n``; ``logits`` fed to the loss
                what = ("its autograd graph" if scalar or freed
                        else "its autograd graph and every activation saved for backward")
                if s.kind == "accumulate" and isinstance(s.fact, Call):  # a meter's update
                    msg = (f"`{s.container}.{METER_UPDATE}(...)` adds {shown} with {what} into the meter's running "
                           f"sum, which keeps every step's graph until the meter is reset; pass "
                           f"`{_item_of(model, value)}.item()` instead")
                elif s.kind == "accumulate":
                    msg = (f"`{s.container}` accumulates {shown} with {what} across iterations, so memory grows "
                           f"every step; accumulate `{_item_of(model, value)}.item()` (or `.detach()`) instead")
                elif dropped:
                    kept = "its graph" if scalar or freed else "its graph and saved activations"
                    msg = (f"{shown} is stored in `{s.container}` with {kept} until the loop ends: the list is "
                           f"detached only after the loop, so every step's graph stays alive and memory grows with "
                           f"the loop's length; store `.detach()` (or run the loop under `torch.no_grad()`) instead")
                else:
                    held = s.container
                    if isinstance(s.fact, Call) and isinstance(s.fact.receiver, cst.Subscript):
                        held = model.module.code_for_node(s.fact.receiver)  # ``collect['cost']``
                    msg = (f"{shown} is stored in `{held}` with {what}, kept alive across iterations so "
                           "memory grows every step; store `.item()` or `.detach()` instead")
                fix = self._fix(model, s, value)
                yield s, (Finding.from_text(s.node, msg, fix=fix, fix_safe=True) if fix
                          else Finding.from_text(s.node, msg))
                break
