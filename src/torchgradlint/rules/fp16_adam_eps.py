"""TGL305 fp16-adam-eps."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ..analysis.dtype_facts import is_float16
from ..analysis.literals import number
from ..analysis.model import Call, FileModel
from ..analysis.modes import constructor_kind, is_module
from ..analysis.names import dotted_name
from ..analysis.tree import walk
from ..registry import Finding, Rule

#: Adam-family optimizers whose update divides by ``sqrt(v) + eps`` (default eps 1e-8)
ADAM_FAMILY = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam"})
#: the smallest positive float16 (subnormal) is 2**-24 = 5.96e-8: a smaller eps rounds to 0
FP16_TINY = 6e-8
_DEFAULT_EPS = 1e-8
_PARAM_METHODS = frozenset({"parameters", "named_parameters"})


def _adam_name(qn: Optional[str]) -> Optional[str]:
    """``"Adam"`` for ``torch.optim.Adam`` / ``torch.optim.adam.Adam`` ...; ``None`` otherwise."""
    if not qn or not qn.startswith("torch.optim."):
        return None
    last = qn.rsplit(".", 1)[-1]
    return last if last in ADAM_FAMILY else None


#: wrappers that keep float32 master copies of the parameters and hand those to the optimizer
_MASTER_WEIGHTS = frozenset({"apex.fp16_utils.FP16_Optimizer", "apex.fp16_utils.fp16_optimizer.FP16_Optimizer",
                             "apex.optimizers.FP16_Optimizer", "apex.amp.initialize"})


def _master_weights(model: FileModel, adam: Call) -> bool:
    """Whether the optimizer ``adam`` builds is handed to a wrapper that steps
    float32 master weights instead (apex's ``FP16_Optimizer(optimizer)``,
    ``amp.initialize(model, optimizer, opt_level="O2")``): its eps then acts
    on float32 values."""
    names = {t.text for a in model.assigns if a.value is adam.node for t in a.targets if t.text}
    if not names:
        return False
    return any((c.qualname or "") in _MASTER_WEIGHTS and c.order > adam.order
               and any(dotted_name(a.value) in names for a in c.node.args)
               for c in model.calls)


def half_conversion(model: FileModel, call: Call) -> Optional[str]:
    """The module text converted to float16 by ``call`` (``M.half()``, ``M.to(torch.float16)``,
    ``M.to(dtype=torch.half)``, ``M.type(torch.float16)``), else ``None``. ``M`` must be known to
    hold a module (:func:`~torchgradlint.analysis.modes.is_module`) or be a module constructor."""
    if call.method not in ("half", "to", "type") or call.receiver is None:
        return None
    if call.method == "half":
        if call.node.args:
            return None
    elif not any(is_float16(model, a.value, call) for a in call.node.args
                 if a.keyword is None or a.keyword.value == "dtype"):
        return None
    text = call.receiver_text
    if text is not None and is_module(model, text):
        return text
    if constructor_kind(model, call.receiver) is not None:  # model = Net().to(device).half()
        for a in model.assigns_in_scope(call.scope):
            if a.statement is call.statement and a.kind in ("assign", "annassign") and not a.unpacked:
                return next((t.text for t in a.targets if t.text), None)
    return None


def _param_owners(model: FileModel, node: cst.BaseExpression, at: Call, depth: int = 0) -> set[str]:
    """Receivers of ``.parameters()`` / ``.named_parameters()`` inside an optimizer's ``params``
    argument (param groups, ``filter(...)``, comprehensions and one local binding included)."""
    owners: set[str] = set()
    for n in walk(node):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in _PARAM_METHODS:
            text = dotted_name(n.func.value)
            if text:
                owners.add(text)
    if not owners and isinstance(node, cst.Name) and depth < 2:
        binding = model.reaching_binding(node.value, at)
        if binding is not None and binding.value is not None and binding.kind in ("assign", "annassign"):
            owners = _param_owners(model, binding.value, at, depth + 1)
    return owners


class Fp16AdamEps(Rule):
    """Adam-family optimizer with ``eps`` below float16's resolution on a module converted to float16.

    Rests on: ``torch.optim.Adam`` (the update divides by ``sqrt(v_t) + eps``, eps default 1e-8),
    "Automatic Mixed Precision" (``torch.amp``: keep float32 parameters, autocast the forward) and
    ``torch.finfo(torch.float16).tiny`` / the float16 format (smallest subnormal 2**-24 = 5.96e-8).
    """

    code = "TGL305"
    name = "fp16-adam-eps"
    summary = "Adam/AdamW with eps < 6e-8 (default 1e-8) on parameters converted to float16"
    probe = "nan-parameters"
    prefilter = (("half", "float16"), ("Adam",))
    docs = """
## What it does
Checks for an Adam-family optimizer (`torch.optim.Adam`, `AdamW`, `Adamax`,
`NAdam`, `RAdam`) built on the parameters of a module that the same function
(or script) converted to float16 before it — `model.half()`,
`model.to(torch.float16)`, `model.to(device, dtype=torch.half)`, or a
constructor chain such as `Net().half()` — when `eps` is left at its default
(1e-8) or set below 6e-8. It stays silent for bfloat16, for mixed precision
with `torch.autocast` and `GradScaler` (the parameters stay float32), for an
explicit `eps` of 1e-7 or more (or one it cannot evaluate), and for a module
converted to float16 only after the optimizer was built (inference or export
after training), or an optimizer handed to a wrapper that steps float32
master weights (apex's `FP16_Optimizer(optimizer)`, `amp.initialize(model,
optimizer, ...)`).

## Why is this bad?
The optimizer's state has the parameters' dtype. Adam divides by
`sqrt(v) + eps`; in float16 the smallest positive number is 2**-24 (5.96e-8),
so `eps=1e-8` rounds to 0. A parameter whose gradient is exactly zero (an
embedding row not in the batch, a dead ReLU unit, a frozen padding index) has
`m = v = 0` and gets `0 / 0 = NaN` at its first step; NaN then spreads through
every forward that touches it. Measured: `Embedding(10, 4).half()` with Adam
at the default eps turns the 7 rows without gradient into NaN after one step;
`eps=1e-4` gives 0.

## Example
```python
import torch

model = torch.nn.Embedding(1000, 64).half()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
```

## Use instead
```python
import torch

model = torch.nn.Embedding(1000, 64).half()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-4)
```

Better still, keep the parameters in float32 and train with
`torch.autocast(device_type, dtype=torch.float16)` and
`torch.amp.GradScaler`.

## References
- [torch.optim.Adam](https://pytorch.org/docs/stable/generated/torch.optim.Adam.html)
- [Automatic Mixed Precision package - torch.amp](https://pytorch.org/docs/stable/amp.html)
- [torch.finfo](https://pytorch.org/docs/stable/type_info.html#torch.finfo)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        halves = [(c, text) for c in model.calls if (text := half_conversion(model, c)) is not None]
        if not halves:
            return
        for call in model.calls:
            name = _adam_name(call.qualname)
            if name is None:
                continue
            eps_node = call.arg(3, "eps")
            eps = _DEFAULT_EPS if eps_node is None else number(eps_node)
            if eps is None or eps >= FP16_TINY:
                continue
            params = call.arg(0, "params")
            if params is None:
                continue
            owners = _param_owners(model, params, call)
            half = self._converted_before(model, call, owners, halves)
            if half is None or _master_weights(model, call):
                continue
            half_call, text = half
            line = f"`{model.module.code_for_node(half_call.node)}`"
            shown = "the default eps=1e-8" if eps_node is None else f"eps={model.module.code_for_node(eps_node)}"
            yield Finding(call.node, (
                f"`{name}` with {shown} on the parameters of `{text}`, converted to float16 by {line}: eps "
                "rounds to 0 in float16, so parameters with an exactly zero gradient become NaN (0/0) at their "
                "first step; pass `eps=1e-4` (or keep float32 parameters with `torch.autocast` and `GradScaler`)"))

    @staticmethod
    def _converted_before(model: FileModel, opt: Call, owners: set[str],
                          halves: list[tuple[Call, str]]) -> Optional[tuple[Call, str]]:
        """The float16 conversion of a parameter owner (or an owner's parent module) that runs before
        the optimizer is built: earlier in the same function, or in another method of the same class for
        ``self.`` attributes."""
        for half_call, text in halves:
            if not any(o == text or o.startswith(text + ".") for o in owners):
                continue
            if half_call.order >= opt.order:
                continue
            same_scope = half_call.scope is opt.scope
            same_class = text.startswith("self.") and half_call.scope.class_name is not None \
                and half_call.scope.class_name == opt.scope.class_name
            if same_scope or same_class:
                return half_call, text
        return None
