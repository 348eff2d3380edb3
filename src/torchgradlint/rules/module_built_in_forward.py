"""TGL007 module-built-in-forward."""

from __future__ import annotations

import re
from typing import Iterator, Optional

import libcst as cst

from ..analysis.model import Call, FileModel, Scope, names_in
from ..analysis.modes import unwrap
from ..analysis.names import dotted_name
from ..analysis.module_class_facts import (
    forward_methods,
    is_parameterised_layer,
    is_torch_module_class,
    nn_layer_name,
    self_name,
)
from ..registry import Finding, Rule

# layers that have an ``nn.Lazy*`` variant (input size inferred at the first call)
_HAS_LAZY = re.compile(r"^(?:Linear|Conv(?:Transpose)?[123]d|BatchNorm[123]d|InstanceNorm[123]d)$")
_REGISTERING = frozenset({"add_module", "register_module", "append", "extend", "insert", "update",
                          "setdefault", "__setitem__"})


def _stores_into(model: FileModel, stmt: cst.CSTNode, owner: str, scope: Scope) -> bool:
    """Whether the statement ``stmt`` keeps what it computes on ``owner``
    (``self.fc = ...``, ``self.cache[k] = ...``, ``self.layers.append(...)``,
    ``self.add_module(...)``, ``setattr(self, ...)``)."""
    prefix = owner + "."
    for a in model.assigns_in_scope(scope):
        if a.statement is stmt:
            for t in a.targets:
                if (t.kind == "attr" and t.text and t.text.startswith(prefix)) or \
                        (t.kind == "subscript" and t.container and (t.container + ".").startswith(prefix)):
                    return True
    if isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call):
        call = stmt.value
        func = call.func
        if isinstance(func, cst.Name) and func.value == "setattr":
            return True
        if isinstance(func, cst.Attribute) and func.attr.value in _REGISTERING:
            return owner in names_in(func.value)
    return False


def _memoised_on_owner(model: FileModel, method: Scope) -> bool:
    """Whether ``method`` is decorated with a same-file decorator that keeps
    its result on the instance with ``setattr`` (byol-pytorch's
    ``@singleton('projector')``: the projector is built at the first call,
    registered as a submodule, and returned from then on)."""
    node = method.node
    if not isinstance(node, cst.FunctionDef):
        return False
    for d in node.decorators:
        name = dotted_name(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
        for s in model.scopes:
            if s.kind == "function" and s.name == name and s.parent is model.module_scope \
                    and re.search(r"\bsetattr\s*\(", model.module.code_for_node(s.node)):
                return True
    return False


class ModuleBuiltInForward(Rule):
    """A layer with parameters constructed inside ``forward``.

    Rests on: ``torch.nn.Module`` (submodules are registered when assigned as
    attributes, "typically in ``__init__``"), ``torch.nn.Module.parameters``,
    ``torch.nn.Module.forward``, and the layers' docs (their weights are
    initialised at random in the constructor, e.g. ``torch.nn.Linear``).
    """

    code = "TGL007"
    name = "module-built-in-forward"
    probe = "unoptimized-grads"
    summary = "a torch.nn layer with parameters built inside forward: new random weights each call, never trained"
    # a parameterised layer's name always contains one of these words, however imported
    prefilter = (("forward",), ("Linear", "Bilinear", "Conv", "Norm", "Embedding", "RNN", "LSTM", "GRU", "Attention",
                                "Transformer", "PReLU"))
    ast_prefilter = "layer-built-in-forward"  # a layer-named call in forward or a method it calls
    docs = """
## What it does
Checks for a `torch.nn` layer that owns parameters (Linear, Bilinear, Conv*,
ConvTranspose*, BatchNorm*, LayerNorm/GroupNorm with affine, Embedding*,
RNN/LSTM/GRU and their cells, MultiheadAttention, Transformer*) constructed
inside `forward` of a `torch.nn.Module` subclass, or inside a method of the
same class that `forward` calls, when it is not kept on the module
(`self.fc = nn.Linear(...)`, `self.layers.append(...)`, `self.add_module(...)`).

It stays silent on parameter-free modules (`nn.ReLU()(x)`, `nn.Dropout`,
pooling), on lazy initialisation (`if self.fc is None: self.fc =
nn.Linear(...)`, or a method whose decorator of the same file keeps its
result on the module with `setattr`, as byol-pytorch's `@singleton`), on
`nn.Lazy*` layers in `__init__`, and on layers built in `__init__` or in
builder methods `forward` does not call.

## Why is this bad?
A layer's constructor draws new random weights. Built inside `forward`, the
layer is a fresh, unregistered object on every call: it is not in
`model.parameters()`, so the optimizer never trains it, `state_dict()` does
not save it and `.to(device)` does not move it (on GPU the forward fails with
a device mismatch). Training runs but cannot fit (measured: loss 3.84 -> 3.88
over 200 steps against 2.79 -> 0.014 for the same model built in `__init__`),
and the same input gives different outputs on every call (max |Δ| 0.71).
Reports: graykode/nlp-tutorial #29, pytorch/pytorch #1291, hearai PR #33.

## Example
```python
from torch import nn


class Classifier(nn.Module):
    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone

    def forward(self, x):
        h = self.backbone(x)
        return nn.Linear(h.shape[-1], 10)(h)
```

## Use instead
```python
from torch import nn


class Classifier(nn.Module):
    def __init__(self, backbone, features):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(features, 10)  # or nn.LazyLinear(10)

    def forward(self, x):
        return self.head(self.backbone(x))
```

## References
- [torch.nn.Module](https://pytorch.org/docs/stable/generated/torch.nn.Module.html)
- [torch.nn.Linear](https://pytorch.org/docs/stable/generated/torch.nn.Linear.html)
- [torch.nn.LazyLinear](https://pytorch.org/docs/stable/generated/torch.nn.LazyLinear.html)
"""

    @staticmethod
    def _kept(model: FileModel, c: Call, me: str) -> bool:
        """The constructed layer is stored on the module or handed to a call that may
        store it (``deep_setattr(deps, k, layer)``), directly or through a local name."""
        if _stores_into(model, c.statement, me, c.scope):
            return True
        for other in model.calls_in_scope(c.scope):
            if other.statement is c.statement and other.order < c.order and \
                    not (other.qualname or "").startswith("torch.") and \
                    any(unwrap(arg.value) is c.node for arg in other.node.args):
                return True  # handed to a call that may store it: deep_setattr(deps, k, nn.Linear(...))
        locals_: set[str] = set()
        for a in model.assigns_in_scope(c.scope):
            if a.statement is c.statement and unwrap(a.value) is c.node:  # layer = nn.Linear(...)
                locals_ |= {t.text for t in a.targets if t.kind == "name" and t.text}
        if not locals_:
            return False
        for a in model.assigns_in_scope(c.scope):
            if a.order > c.order and a.value is not None and names_in(a.value) & locals_ and \
                    _stores_into(model, a.statement, me, c.scope):
                return True
        for other in model.calls_in_scope(c.scope):
            if other.order > c.order and not (other.qualname or "").startswith("torch.") and any(
                    isinstance(unwrap(arg.value), cst.Name) and unwrap(arg.value).value in locals_
                    for arg in other.node.args):
                return True  # handed to a call that may store it
        return False

    def check(self, model: FileModel) -> Iterator[Finding]:
        for info in list(model.classes.values()):
            if "forward" not in info.methods or not is_torch_module_class(model, info.name, lenient=True):
                continue
            for method in forward_methods(model, info):
                me = self_name(method)
                if me is None or _memoised_on_owner(model, method):
                    continue
                for c in model.calls_within(method.order, method.end):
                    if not is_parameterised_layer(model, c.node) or self._kept(model, c, me):
                        continue
                    layer = nn_layer_name(model, c.node)
                    where = "`forward`" if method.name == "forward" else f"`{method.name}` (called from `forward`)"
                    yield Finding(c.node, self._message(layer, where))

    @staticmethod
    def _message(layer: Optional[str], where: str) -> str:
        hint = f" (or `nn.Lazy{layer}(...)` when the input size is known only at run time)" \
            if layer and _HAS_LAZY.match(layer) else ""
        return (f"`nn.{layer}(...)` is constructed inside {where}: every call makes a new layer with fresh random "
                f"weights that the module does not register, so the optimizer never trains it and outputs change "
                f"from call to call; build it once in `__init__` as `self.<name> = nn.{layer}(...)`{hint}")
