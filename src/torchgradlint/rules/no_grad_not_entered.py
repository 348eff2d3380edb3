"""TGL103 no-grad-not-entered."""

from __future__ import annotations

from typing import Iterator

import libcst as cst

from ..analysis.model import FileModel
from ..registry import Finding, Rule

# Grad-mode context managers whose constructor alone changes nothing.
_CONTEXT_ONLY = {
    "torch.no_grad": "grad mode stays enabled, so every result still records an autograd graph",
    "torch.inference_mode": "inference mode is never entered, so every result still records an autograd graph",
    "torch.enable_grad": "grad mode is not enabled by it",
}


class NoGradNotEntered(Rule):
    """``torch.no_grad()`` / ``torch.inference_mode()`` / ``torch.enable_grad()``
    written as a statement: the context manager is built and discarded.

    Rests on: ``torch.no_grad``, ``torch.enable_grad``, ``torch.inference_mode``
    (each is "a context manager" or decorator: it acts in ``__enter__``, when a
    ``with`` block is entered, and in the function a decorator wraps) and the
    autograd notes "Locally disabling gradient computation".
    ``torch.set_grad_enabled(False)`` as a statement *does* switch grad mode (it
    is also a function); it is not this rule's business.
    """

    code = "TGL103"
    name = "no-grad-not-entered"
    summary = "`torch.no_grad()` / `inference_mode()` / `enable_grad()` as a statement does nothing"
    prefilter = (("no_grad", "inference_mode", "enable_grad"),)
    docs = """
## What it does
Checks for an expression statement that is exactly a call of `torch.no_grad`,
`torch.inference_mode` or `torch.enable_grad` (however imported or aliased):

```python
torch.no_grad()
```

It stays silent on `with` items (including parenthesised groups such as
`with (torch.no_grad(), autocast()):`), decorators, assignments
(`ctx = torch.no_grad()`, entered later), `torch.no_grad().__enter__()` and
`torch.set_grad_enabled(False)`, which does switch grad mode when called as a
function.

## Why is this bad?
These are context managers: they change grad mode only when a `with` block
enters them (or around a function they decorate). Calling one as a statement
builds the object and throws it away, so nothing changes: after a bare
`torch.no_grad()` `torch.is_grad_enabled()` is still `True` and every
evaluation output keeps its autograd graph and the activations saved for
backward. Code written this way runs and gives the right numbers, while it
uses the memory and time of training (measured: 50 of 50 evaluation outputs
held a graph; kuprel/min-dalle PR #24, "significantly reduced the memory
usage" once fixed).

## Example
```python
def evaluate(model, loader):
    model.eval()
    torch.no_grad()
    return [model(x) for x, _ in loader]
```

## Use instead
```python
@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    return [model(x) for x, _ in loader]
```

No autofix is offered: which statements belong inside the `with` block is
the author's decision.

## References
- [torch.no_grad](https://pytorch.org/docs/stable/generated/torch.no_grad.html)
- [torch.inference_mode](https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html)
- [torch.enable_grad](https://pytorch.org/docs/stable/generated/torch.enable_grad.html)
- [Locally disabling gradient computation](https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        for c in model.calls:
            effect = _CONTEXT_ONLY.get(c.qualname or "")
            if effect is None:
                continue
            stmt = c.statement
            if not isinstance(stmt, cst.Expr) or stmt.value is not c.node:
                continue
            api = c.func_text or c.qualname
            yield Finding(c.node, f"`{api}()` as a statement builds a context manager and discards it: "
                                  f"{effect}; use `with {api}():` or decorate the function with `@{api}()`")
