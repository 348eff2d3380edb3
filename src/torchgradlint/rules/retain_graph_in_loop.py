"""TGL102 retain-graph-in-loop."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ..analysis.literals import is_literal
from ..analysis.model import Call, FileModel, Loop, argument_for, names_in
from ..analysis.modes import constructor_kind
from ..analysis.names import dotted_name
from ..analysis.provenance import State, call_fact, is_module_call, provenance
from ..analysis.torch_api import DETACHING_METHODS
from ..analysis.steps import backward_call, covers, is_true, optimizer_constructors, optimizer_modules, optimizer_step
from ..analysis.training import runs_backward
from ..analysis.tree import walk
from ..registry import Finding, Rule


class RetainGraphInLoop(Rule):
    """``retain_graph=True`` on the last backward of a loop iteration whose
    graph is rebuilt every iteration.

    Rests on: ``torch.Tensor.backward`` (``retain_graph``: "If False, the graph
    used to compute the grads will be freed"), ``torch.autograd.grad`` and
    autograd mechanics ("Saved tensors").
    """

    code = "TGL102"
    name = "retain-graph-in-loop"
    summary = "retain_graph=True on the last backward of a loop iteration that rebuilds its graph"
    probe = "retained-graph"
    prefilter = (("retain_graph",),)
    # check(): every finding is at a backward call (analysis.steps.backward_call).
    needs_backward = True
    docs = """
## What it does
Checks for `retain_graph=True` on the last backward of a loop iteration
(`loss.backward(...)`, `torch.autograd.grad(...)`, `torch.autograd.backward(...)`)
when the tensor it backpropagates is recomputed by a forward pass inside the
same iteration.

## Why is this bad?
A backward normally frees the graph's saved tensors (the activations the
forward pass stored for the backward) as soon as it has used them.
`retain_graph=True` keeps them alive. When nothing in the iteration
backpropagates through that graph again, the retained graph is pure waste: it
stays in memory until the next forward pass replaces it, so peak memory holds
an extra graph.

It is much worse when state is carried from one iteration to the next without
`.detach()` (`h = rnn(x, h)`, `hidden = model(x, hidden)`): every iteration's
graph then hangs off the previous one, and `retain_graph=True` is usually what
silenced "Trying to backward through the graph a second time". Each step now
backpropagates through *all* earlier steps: memory and time per step grow
with the number of steps (measured: 200 steps ran 40x slower than the first).

It also reports a retained graph that a later backward of the iteration does
use, when an optimizer `step()` between the two updates the weights of a
module in that graph (`ge_loss.backward(retain_graph=True); opt_ge.step();
d_loss.backward()` through the same generated images): the step changes the
saved weights in place, and the second backward raises "one of the variables
needed for gradient computation has been modified by an inplace operation"
(or, before PyTorch 1.5, silently used the new weights).

The rule stays silent when the retained graph is needed: a later backward in
the same iteration (`loss1.backward(retain_graph=True); loss2.backward()`, a
GAN's discriminator step followed by the generator's), rows of a Jacobian or
Hessian over one graph built before the loop, `create_graph=True`, a
conditional detach (truncated BPTT every k steps), or a non-literal
`retain_graph=flag`.

## Example
```python
h = torch.zeros(1, batch, hidden)
for x, y in chunks:
    out, h = rnn(x, h)
    loss = criterion(head(out), y)
    optimizer.zero_grad()
    loss.backward(retain_graph=True)
    optimizer.step()
```

## Use instead
```python
h = torch.zeros(1, batch, hidden)
for x, y in chunks:
    h = h.detach()  # truncated BPTT: cut the graph at the chunk boundary
    out, h = rnn(x, h)
    loss = criterion(head(out), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
```

## References
- [torch.Tensor.backward](https://pytorch.org/docs/stable/generated/torch.Tensor.backward.html) (`retain_graph`)
- [torch.autograd.grad](https://pytorch.org/docs/stable/generated/torch.autograd.grad.html)
- [torch.autograd.backward](https://pytorch.org/docs/stable/generated/torch.autograd.backward.html)
- [Autograd mechanics: saved tensors](https://pytorch.org/docs/stable/notes/autograd.html#saved-tensors)
- [torch.Tensor.detach](https://pytorch.org/docs/stable/generated/torch.Tensor.detach.html)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        for call in model.calls:
            bw = backward_call(model, call)
            if bw is None or not is_true(bw.retain_graph):
                continue
            create = bw.create_graph
            if create is not None and not is_literal(create, False):
                continue  # higher-order gradients reuse the graph on purpose
            if call.loop is None:
                finding = self._in_helper(model, call, bw)
                if finding is not None:
                    yield finding
                continue
            loop = call.loop
            graph = provenance(model, bw.target, call)
            if not _rebuilt_each_iteration(model, graph, bw.target, call, loop):
                continue  # nothing is rebuilt per iteration (rows of a Jacobian over one graph), or unknown
            verdict = _later_use(model, call, graph, loop, bw.target)
            if verdict is None:
                continue  # a later backward needs the retained graph (or cannot be told)
            what = _describe(model, bw.target)
            if isinstance(verdict, Call):
                step = optimizer_step(model, verdict)
                opt = step.optimizer if step is not None and step.optimizer else "the optimizer"
                yield Finding.from_text(call.node, (
                    f"the graph of {what} is retained for a later backward in the iteration, but `{opt}.step()` "
                    "updates weights that graph saved in between, so that backward uses stale saved tensors "
                    "(it raises \"modified by an inplace operation\"); run both backwards before the step, or "
                    "recompute the forward after it"))
                continue
            carried = _carried(model, bw.target, call, loop)
            if carried is not None and _detached_now_and_then(model, carried[0], call, loop):
                continue  # truncated BPTT every k steps: the graph is needed until the next cut
            if carried is not None:
                name, binding = carried
                stmt = model.module.code_for_node(binding.node).strip().splitlines()[0]
                msg = (f"`retain_graph=True` on the last backward of the iteration keeps the graph of {what} "
                       f"alive, and `{name}` carries it into the next iteration (`{stmt}`), so every step "
                       "backpropagates through all earlier steps: memory and time grow every step; detach "
                       f"the carried state each iteration (`{name} = {name}.detach()`, truncated BPTT) and "
                       "drop `retain_graph=True`")
            else:
                msg = (f"`retain_graph=True` keeps the graph of {what} alive although no later backward of the "
                       "iteration uses it and the next iteration rebuilds it, so the saved tensors of every "
                       "iteration stay in memory until the next forward pass replaces them; drop "
                       "`retain_graph=True`")
            yield Finding.from_text(call.node, msg)


    @staticmethod
    def _in_helper(model: FileModel, call: Call, bw) -> "Finding | None":
        """A retaining backward in a loop-free helper that a loop calls
        (``def update(latents, loss): torch.autograd.grad(loss, ...,
        retain_graph=True)``): judged at each calling loop, with the target's
        parameters bound to the call site's arguments. Fires only when the
        helper's backward is its last one and no later backward of any calling
        iteration uses the graph."""
        fn = model.enclosing_function(call.scope)
        if fn is None or fn.kind != "function":
            return None
        if any(runs_backward(model, c, accumulating_only=False)
               for c in model.calls_within(call.order + 1, fn.end) if c.scope is fn):
            return None  # a later backward in the helper may need the graph
        params = {n.split(".")[0] for n in names_in(bw.target)} & set(fn.params)
        sites = [site for site in model.callers_of(fn) if site.loop is not None]
        if not sites:
            return None
        for site in sites:
            if len(params) != 1:
                return None
            arg = argument_for(site, fn, next(iter(params)))
            if arg is None:
                return None
            graph = provenance(model, arg, site)
            if not _rebuilt_each_iteration(model, graph, arg, site, site.loop):
                return None  # not rebuilt per iteration, or cannot be told
            if _later_use(model, site, graph, site.loop, None) != "unused":
                return None
        what = _describe(model, bw.target)
        return Finding.from_text(call.node, (
            f"`retain_graph=True` keeps the graph of {what} alive although no later backward uses it: "
            f"`{fn.name}()` is called in a loop that rebuilds the graph every iteration, so the saved tensors of "
            "each call stay in memory until the next forward pass replaces them; drop `retain_graph=True`"))


def _rebuilt_each_iteration(model: FileModel, graph, target, at: Call, loop: Loop) -> bool:
    """Whether the graph backpropagated from ``target`` at ``at`` is built
    anew in every iteration of ``loop``: its known sources lie in the loop;
    or, when the evaluator cannot tell where the graph comes from (a loss
    read from attention maps captured by hooks), every name the target
    reads may only come from bindings in the loop before ``at`` that compute
    a value (a backward target always carries a graph, else backward
    raises)."""
    inside = _node_ids(model, loop)
    scope_ids = _node_ids(model, at.scope)
    if (any(id(src) in scope_ids and id(src) not in inside and not _same_file_call(model, src)
            for src in graph.sources)
            or _reads_pre_loop_graph(model, target, at, loop, strict=graph.state is not State.UNKNOWN)) \
            and _carried(model, target, at, loop) is None:
        # A prefix of the graph is built before the loop (one forward whose
        # slices each iteration backpropagates, a distribution, Hessian rows of
        # a gradient taken with create_graph=True): every backward goes through
        # it, so it must be retained.
        return False
    if graph.attached and graph.sources:
        return any(id(src) in inside for src in graph.sources)
    if graph.state is not State.UNKNOWN or graph.weak:
        return False
    names = [n for n in names_in(target) if "." not in n]
    if not names:
        return False
    for name in names:
        bindings = model.reaching_bindings(name, at)
        if not bindings or any(
                not loop.contains(b.order) or b.order > at.order or b.kind not in ("assign", "annassign")
                or not isinstance(b.value, (cst.Call, cst.BinaryOperation, cst.UnaryOperation, cst.Subscript))
                for b in bindings):
            return False
    return True


# torch objects that hold no graph (a GradScaler, an optimizer, a data loader).
_NO_GRAPH_OBJECTS = ("torch.amp.", "torch.cuda.amp.", "torch.optim.", "torch.utils.data.")


def _same_file_call(model: FileModel, node) -> bool:
    """Whether ``node`` calls a same-file function (whose returned graph the
    evaluator only approximates)."""
    fact = call_fact(model, node)
    return fact is not None and bool(model.resolve_callee(fact))


# Tensor methods whose result carries no graph, and builtins that make plain Python values.
_GRAPH_FREE_RESULTS = DETACHING_METHODS | {"size", "dim", "numel", "data_ptr"}
_PYTHON_VALUES = frozenset({"len", "int", "float", "bool", "str", "isinstance", "range"})


def _value_names(node) -> set[str]:
    """Dotted names ``node`` reads as values: operands, arguments and method
    receivers, not the functions or modules it calls (``model`` in
    ``model(x)`` and ``model.forward(x)``)."""
    found: set[str] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        if isinstance(n, (cst.Name, cst.Attribute)):
            d = dotted_name(n)
            if d:
                found.add(d.split(".")[0])
                continue
        if isinstance(n, cst.Call):
            if isinstance(n.func, cst.Attribute) and n.func.attr.value in _GRAPH_FREE_RESULTS \
                    or isinstance(n.func, cst.Name) and n.func.value in _PYTHON_VALUES:
                continue  # ``weights.detach()``, ``len(weights)``: no graph flows out
            todo += [a.value for a in n.args]
            if isinstance(n.func, cst.Attribute):
                if n.func.attr.value != "forward":  # ``generator.forward(z)`` calls the module
                    todo.append(n.func.value)  # ``dist.log_prob(y)``: the receiver's value flows in
            elif not isinstance(n.func, cst.Name):
                todo.append(n.func)
            continue
        todo += [c for c in n.children if isinstance(c, cst.CSTNode)]
    return found


def _reads_pre_loop_graph(model: FileModel, target, at: Call, loop: Loop, *, strict: bool = True) -> bool:
    """Whether the backpropagated value reads, through bindings made in the
    loop, a value computed before the loop that may hold a graph (not a
    constant, a bare leaf, a module or an optimizer): ``dist =
    Categorical(logits=x)`` whose ``log_prob`` each iteration
    backpropagates, ``flat_dy`` of a ``create_graph=True`` gradient.
    ``strict``: only values known to carry graph sources count; otherwise
    (for a target of unknown origin) any computed, non-constant value does."""
    todo = [(n, at, 0) for n in _value_names(target)]
    seen: set[str] = set()
    while todo:
        name, point, depth = todo.pop()
        if name in seen or depth > 4 or name in ("self", "cls"):
            continue
        seen.add(name)
        for b in model.reaching_bindings(name, point):
            if b.kind not in ("assign", "annassign") or b.value is None:
                continue
            if loop.contains(b.order):
                todo += [(n, b, depth + 1) for n in _value_names(b.value)]
                continue
            if not isinstance(b.value, cst.Call) or constructor_kind(model, b.value) is not None \
                    or optimizer_constructors(model).get(name) is b \
                    or (model.qualname(b.value.func) or "").startswith(_NO_GRAPH_OBJECTS):
                continue
            p = provenance(model, b.value, b)
            if p.weak or p.detached or (p.attached and _same_file_call(model, b.value)):
                continue  # a same-file helper's attached result is only approximated (a module returning a leaf)
            if p.sources or p.state is State.ATTACHED or not strict:
                return True  # a graph built before the loop (``beta = log_beta.exp()`` of a leaf that
                # requires grad; for an unknown target, maybe one)
    return False


def _node_ids(model: FileModel, region) -> frozenset[int]:
    """Ids of every node inside ``region`` (a loop, or a scope's whole
    definition), memoised per region."""
    key = ("node-ids", id(region.node))
    found = model.memo.get(key)
    if found is None:
        found = model.memo[key] = frozenset(id(n) for n in walk(region.node))
    return found  # type: ignore[return-value]


def _later_use(model: FileModel, call: Call, graph, loop: Loop, target: "cst.BaseExpression | None"):
    """How the retained graph is used later in the same iteration.

    ``"unused"`` when no later backward of the iteration shares any part of
    its graph; the optimizer-step :class:`Call` when a later backward shares
    a module call whose parameters that step updated in between; ``None``
    when a later backward legitimately shares it (a source of the graph), or
    when a later backward's graph cannot be told (a helper, an unknown
    target, or, for a graph traced to no forward pass, a target computed
    from a variable of the iteration the retained one is computed from too:
    ``log_prob = calc_logprob(net(s), a)`` behind both losses). ``target``:
    the retained backward's tensor, when known.
    """
    mine = {id(s): s for s in graph.sources}
    outer = call.loops[0]  # the iteration of every enclosing loop of the scope goes on after ``call``
    later = [c for c in model.calls_within(call.order + 1, outer.end) if c.scope is call.scope]
    # a graph traced to no forward pass (``calc_logprob(mu, ...)`` of an unknown model) is compared by
    # the variables of the iteration both targets are computed from
    traced = any(is_module_call(model, s) for s in graph.sources)
    derived = _derived_names(model, target, call, outer) if target is not None and not traced else set()
    shared_any = unknown = False
    for other in later:
        bw = backward_call(model, other)
        if bw is None:
            # a helper backpropagates: what it shares cannot be told (a later backward that
            # shares a module stepped in between is a defect whatever the helper does)
            unknown = unknown or runs_backward(model, other, accumulating_only=False)
            continue
        theirs = provenance(model, bw.target, other)
        if not theirs.attached and not theirs.sources:
            unknown = True
            continue
        shared = [mine[id(s)] for s in theirs.sources if id(s) in mine]
        if not shared:
            if not traced and derived & _derived_names(model, bw.target, other, outer):
                unknown = True  # both computed from one variable of the iteration: may share its graph
            continue
        shared_any = True
        for step_call in later:
            if not (call.order < step_call.order < other.order):
                continue
            step = optimizer_step(model, step_call)
            modules = optimizer_modules(model, step.optimizer) if step is not None else None
            if modules is None:
                continue
            for src in shared:
                fact = call_fact(model, src)
                if fact is not None and is_module_call(model, src) and covers(modules, fact.func_text):
                    return step_call
    return None if shared_any or unknown else "unused"


def _derived_names(model: FileModel, expr: "cst.BaseExpression | None", at: Call, loop: Loop) -> set[str]:
    """The variables assigned in ``loop`` before ``at`` that ``expr``
    (evaluated at ``at``) is computed from, directly or through other such
    variables (not the loop's own targets: the batch both losses read)."""
    return {name for name, b, point in _loop_bindings(model, expr, at, loop) if b.order < point.order}


def _loop_bindings(model: FileModel, expr: "cst.BaseExpression | None", at: Call, loop: Loop):
    """The assignments in ``loop`` that ``expr`` (evaluated at ``at``) reads,
    followed back through the names they read, each as ``(name, binding,
    the point it reaches)``; a binding that reaches its point from the
    previous iteration (after it, or in the same statement: ``h = f(h)``)
    is yielded but not followed. At most 60 (name, point) pairs."""
    todo = [(n, at) for n in names_in(expr)] if expr is not None else []
    seen: set[tuple[str, int]] = set()
    while todo and len(seen) < 60:
        name, point = todo.pop()
        if (name, id(point)) in seen:
            continue
        seen.add((name, id(point)))
        for b in model.reaching_bindings(name, point):
            if not loop.contains(b.order) or b.value is None or b.kind not in ("assign", "annassign", "augassign"):
                continue
            yield name, b, point
            if not (b.order > point.order or b.statement is point.statement):
                todo += [(n, b) for n in names_in(b.value)]


def _detached_now_and_then(model: FileModel, name: str, call: Call, loop: Loop) -> bool:
    """Whether ``name`` is detached inside ``loop`` only on some iterations
    (``if t % k == 0: h = h.detach()``)."""
    for b in model.bindings_of(name, call.scope):
        if loop.contains(b.order) and isinstance(b.value, cst.Call) and isinstance(b.value.func, cst.Attribute) \
                and b.value.func.attr.value in ("detach", "detach_") and not model.always_runs_in(loop, b):
            return True
    return any(loop.contains(c.order) and c.receiver_text == name and c.method == "detach_"
               and not model.always_runs_in(loop, c) for c in model.calls_in_scope(call.scope))


def _carried(model: FileModel, target, call: Call, loop: Loop):
    """A name on the target's path whose value flows in from the previous
    iteration without being detached (``h`` in ``out, h = rnn(x, h)``), with
    the binding that carries it; ``None`` if there is none."""
    for name, b, point in _loop_bindings(model, target, call, loop):
        wrapped = b.order > point.order or b.statement is point.statement
        if wrapped and isinstance(b.value, (cst.Call, cst.BinaryOperation)) \
                and not provenance(model, b.value, b).detached:
            return name, b
    return None


def _describe(model: FileModel, target: "cst.BaseExpression | None") -> str:
    if target is None:
        return "the loss"
    text = model.module.code_for_node(target).strip()
    if len(text) > 40 or "\n" in text:
        return "the loss"
    return f"`{text}`"
