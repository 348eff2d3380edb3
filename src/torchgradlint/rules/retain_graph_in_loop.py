"""TGL102 retain-graph-in-loop."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ..analysis.loop_state import IterationAnalysis, backward_follows_in_iteration
from ..analysis.model import FileModel, is_literal
from ..analysis.steps import backward_call, is_true
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
        analysis = None
        for call in model.calls:
            if call.loop is None:
                continue
            bw = backward_call(model, call)
            if bw is None or not is_true(bw.retain_graph):
                continue
            create = bw.create_graph
            if create is not None and not is_literal(create, False):
                continue  # higher-order gradients reuse the graph on purpose
            if backward_follows_in_iteration(model, call):
                continue
            if analysis is None:
                analysis = IterationAnalysis(model)
            found = analysis.slice(bw.target, call, call.loop)
            if not found.fresh_graph:
                continue
            what = _describe(model, bw.target)
            if found.carried:
                name, binding = next(iter(sorted(found.carried.items())))
                stmt = model.module.code_for_node(binding.node).strip().splitlines()[0]
                msg = (f"`retain_graph=True` on the last backward of the iteration keeps the graph of {what} "
                       f"alive, and `{name}` carries it into the next iteration (`{stmt}`), so every step "
                       "backpropagates through all earlier steps: memory and time grow every step; detach "
                       f"the carried state each iteration (`{name} = {name}.detach()`, truncated BPTT) and "
                       "drop `retain_graph=True`")
            else:
                msg = (f"`retain_graph=True` on the last backward of the iteration keeps the graph of {what} "
                       "alive although the next iteration rebuilds it, so the saved tensors of every "
                       "iteration stay in memory until the next forward pass replaces them; drop "
                       "`retain_graph=True`")
            yield Finding.from_text(call.node, msg)


def _describe(model: FileModel, target: "cst.BaseExpression | None") -> str:
    if target is None:
        return "the loss"
    text = model.module.code_for_node(target).strip()
    if len(text) > 40 or "\n" in text:
        return "the loss"
    return f"`{text}`"
