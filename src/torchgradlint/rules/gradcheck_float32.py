"""TGL304 gradcheck-float32."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ..analysis.dtype_facts import COMPLEX, DOUBLE, SINGLE, tensor_kind
from ..analysis.model import Call, FileModel
from ..registry import Finding, Rule

#: qualified names of the finite-difference checkers
GRADCHECKS = frozenset({
    "torch.autograd.gradcheck", "torch.autograd.gradgradcheck",
    "torch.autograd.gradcheck.gradcheck", "torch.autograd.gradcheck.gradgradcheck",
})


def _inputs(model: FileModel, call: Call) -> list[cst.BaseExpression]:
    """The tensors handed to ``gradcheck(func, inputs, ...)``: a tuple/list element-wise (also one bound
    to a local name first), else the one value."""
    node = call.arg(1, "inputs")
    if node is None:
        return []
    if isinstance(node, cst.Name):
        binding = model.reaching_binding(node.value, call)
        if binding is not None and binding.kind == "assign" and not binding.unpacked \
                and isinstance(binding.value, (cst.Tuple, cst.List)):
            node = binding.value
    if isinstance(node, (cst.Tuple, cst.List)):
        return [e.value for e in node.elements if not isinstance(e, cst.StarredElement)]
    return [node]


class GradcheckFloat32(Rule):
    """``torch.autograd.gradcheck`` / ``gradgradcheck`` run on float32 inputs.

    Rests on: ``torch.autograd.gradcheck`` ("The check between numerical and
    analytical gradients uses allclose() ... This check will likely fail if
    input is not double precision, e.g., FloatTensor") and the autograd
    "Gradcheck mechanics" notes.
    """

    code = "TGL304"
    name = "gradcheck-float32"
    summary = "gradcheck/gradgradcheck on float32 inputs: finite differences too coarse to judge gradients"
    probe = "gradcheck-power"
    prefilter = (("gradcheck",),)
    docs = """
## What it does
Checks for `torch.autograd.gradcheck` and `torch.autograd.gradgradcheck`
(imported under any alias, also `torch.autograd.gradcheck.gradcheck`) whose
tensor inputs are created in single precision: a factory such as
`torch.randn(...)` / `torch.rand(...)` without `dtype=torch.float64`, a
`.float()` / `.half()` cast, or arithmetic on such tensors, followed through
local variables and tuple elements, and a function's parameter to what every
same-file caller passes for it. It stays silent when every differentiable
input is `float64` or complex (`dtype=torch.double`, `.double()`,
`.to(torch.float64)`), when an input's origin is unknown (a parameter without
same-file callers or whose callers pass different kinds, a tensor returned by
an unknown call), and in files that call
`torch.set_default_dtype(torch.float64)`.

## Why is this bad?
`gradcheck` compares the analytical Jacobian with central finite differences
(`eps=1e-6`) against `atol=1e-5`, `rtol=1e-3`. In float32 the perturbation is
near the resolution of the values themselves, so the numerical Jacobian is
noise: correct backward functions fail (measured: 0/100 correct functions pass
in float32, 100/100 in float64). Users then loosen `eps`/`atol`/`rtol` until
the check passes, and the loosened check passes a backward that is 1 % wrong
(10/10 in float32; float64 with the default tolerances catches it 10/10).
PyTorch itself warns "Input #0 requires gradient and is not a double
precision floating point or complex".

## Example
```python
import torch
from torch.autograd import gradcheck

x = torch.randn(8, 4, requires_grad=True)
w = torch.randn(4, 3, requires_grad=True)
gradcheck(torch.matmul, (x, w), eps=1e-3, atol=1e-2)
```

## Use instead
```python
import torch
from torch.autograd import gradcheck

x = torch.randn(8, 4, dtype=torch.float64, requires_grad=True)
w = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
gradcheck(torch.matmul, (x, w))
```

## References
- [torch.autograd.gradcheck](https://pytorch.org/docs/stable/generated/torch.autograd.gradcheck.gradcheck.html)
- [torch.autograd.gradgradcheck](https://pytorch.org/docs/stable/generated/torch.autograd.gradcheck.gradgradcheck.html)
- [Gradcheck mechanics](https://pytorch.org/docs/stable/notes/gradcheck.html)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        for call in model.calls:
            if call.qualname not in GRADCHECKS:
                continue
            single = self._single_input(model, call)
            if single is None:
                continue
            text = model.module.code_for_node(single)
            shown = f"`{text}`" if len(text) <= 40 else "a tensor input"
            api = call.qualname.rsplit(".", 1)[-1]
            yield Finding(call.node, (
                f"`{api}` input {shown} is float32: finite differences in single precision cannot resolve "
                "the Jacobian, so correct gradients fail and loosened tolerances pass wrong ones; create the "
                "inputs with `dtype=torch.float64` (or `.double()`)"))

    @staticmethod
    def _single_input(model: FileModel, call: Call) -> Optional[cst.BaseExpression]:
        """The first single-precision input, if no input is double or complex (promotion would lift it)."""
        first = None
        for node in _inputs(model, call):
            kind = tensor_kind(model, node, call)
            if kind in (DOUBLE, COMPLEX):
                return None
            if kind == SINGLE and first is None:
                first = node
        return first
