"""TGL006 unregistered-submodule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import libcst as cst

from ..analysis.model import Assign, ClassInfo, FileModel, Scope, _Located, called_at_once, names_in, unwrap
from ..analysis.modes import LIST_ADDS
from ..analysis.module_class_facts import (
    is_requires_grad_tensor,
    is_stateful_module_ctor,
    is_torch_factory,
    is_torch_module_class,
    nn_layer_name,
    self_name,
)
from ..analysis.names import dotted_name
from ..analysis.torch_api import MODULE_RETURNING_METHODS
from ..analysis.training import frozen_module
from ..analysis.tree import walk
from ..registry import Finding, Rule

_WRAPPERS = frozenset(f"torch.nn.{n}" for n in (
    "ModuleList", "ModuleDict", "Sequential", "ParameterList", "ParameterDict", "Parameter", "Buffer"))
_REGISTER_METHODS = frozenset({"register_parameter", "register_buffer", "add_module", "register_module"})
# Calls that only read or iterate a container: passing ``self.x`` to them cannot register it.
_READERS = frozenset({"len", "enumerate", "zip", "reversed", "range", "list", "tuple", "iter", "print", "isinstance",
                      "sorted", "getattr", "hasattr", "sum", "map", "next", "min", "max", "str", "repr", "id"})


#: tensor methods that return a new tensor when they change the device or dtype
_CONVERSIONS = frozenset({"to", "cuda", "cpu", "half", "float", "double", "bfloat16", "type"})


@dataclass
class _Held:
    """What a plain container or tensor attribute holds."""

    kind: str  # "modules" | "tensors" | "tensor" | "converted"
    example: str  # e.g. "nn.Linear", "requires_grad tensor"
    container: str  # "list" | "dict" | ""


def _elements(node: cst.BaseExpression) -> Optional[tuple[str, list[cst.BaseExpression]]]:
    """Element values of a list/tuple/set/dict display or comprehension."""
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        return "list", [e.value for e in node.elements if isinstance(e, cst.Element)]
    if isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp)):
        return "list", [node.elt]
    if isinstance(node, cst.Dict):
        return "dict", [e.value for e in node.elements if isinstance(e, cst.DictElement)]
    if isinstance(node, cst.DictComp):
        return "dict", [node.value]
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        for side in (node.left, node.right):  # ``[None] * n``: slots filled by ``xs[i] = ...``
            if isinstance(side, cst.List):
                return _elements(side)
    return None


def _hands_over(value: cst.BaseExpression, texts: set[str]) -> bool:
    """Whether the argument ``value`` gives the callee one of the containers
    ``texts`` itself: the name (``Block(self.layers)``), in a list or tuple
    display (``Wrapper([self.layers, self.heads])``) or as an element
    (``Wrapper(self.layers[0])``, which may register the layer); not the
    output of a call that reads it (``self.head(self.layers[0](x))``), nor
    a comprehension over it (``torch.cat([m(x) for m in self.layers])``)."""
    if isinstance(value, (cst.List, cst.Tuple)):
        return any(_hands_over(e.value, texts) for e in value.elements)
    if isinstance(value, cst.Subscript):
        value = value.value
    return dotted_name(value) in texts


def _float32_already(model: FileModel, call: cst.Call) -> bool:
    """``nn.Parameter(torch.ones(n)).float()``: ``.float()`` of a parameter made
    from a torch factory with no ``dtype`` (float32 by default) returns the
    parameter itself (rasbt's RMSNorm)."""
    wrapped = call.func.value  # type: ignore[attr-defined]
    if call.func.attr.value != "float" or not isinstance(wrapped, cst.Call) or not wrapped.args:  # type: ignore
        return False
    data = wrapped.args[0].value
    return is_torch_factory(model, data) and isinstance(data, cst.Call) \
        and not any(a.keyword is not None and a.keyword.value == "dtype" for a in data.args)


def _initialised(model: FileModel, init: Scope, text: str) -> set[int]:
    """Ids of the ``text`` nodes (``self.w``) that ``init`` only initialises in
    place: the tensor of ``torch.nn.init.xavier_normal_(self.w)``, the receiver
    of ``self.w.uniform_(-1, 1)`` (an in-place method): no use of the value."""
    out: set[int] = set()
    for c in model.calls_in_scope(init):
        qn = c.qualname or ""
        if qn.startswith("torch.nn.init."):
            arg = c.arg(0, "tensor")
            if arg is not None and dotted_name(arg) == text:
                out.add(id(arg))
        elif c.receiver_text == text and c.method and c.method.endswith("_") and not c.method.startswith("_"):
            out.add(id(c.receiver))
    return out


class UnregisteredSubmodule(Rule):
    """Layers or trainable tensors kept where ``nn.Module`` does not register them.

    Rests on: ``torch.nn.Module`` ("Submodules assigned in this way will be
    registered" - only direct ``nn.Module`` / ``nn.Parameter`` attributes are),
    ``torch.nn.ModuleList``, ``torch.nn.ModuleDict``, ``torch.nn.ParameterList``,
    ``torch.nn.Parameter`` and ``torch.nn.Module.parameters``.
    """

    code = "TGL006"
    name = "unregistered-submodule"
    probe = "unoptimized-grads"
    summary = "layers in a plain list/dict, or a requires_grad tensor instead of nn.Parameter, on a torch nn.Module"
    prefilter = (("__init__",),)
    ast_prefilter = "unregistered-attribute"  # an ``__init__`` storing a container or a requires_grad tensor
    docs = """
## What it does
In `__init__` of a `torch.nn.Module` subclass, checks for attributes that hold
modules or trainable tensors where the module cannot register them:

- `self.layers = [nn.Linear(...), ...]`, a list comprehension of layers, a
  dict of layers, or a list built with `append` (directly or through a local
  list) or filled slot by slot (`self.heads = {}` or `[None] * n`, then
  `self.heads[k] = nn.Linear(...)`) - containing `torch.nn` layers that have
  parameters, buffers or a train/eval behaviour (dropout), or instances of the
  file's own modules;
- `self.w = torch.randn(..., requires_grad=True)` (or a list of such tensors);
- `self.w = nn.Parameter(t).to(device)` (or `.cuda()`, `.half()`, `.double()`...):
  converted after wrapping, the result is a new plain tensor whenever the
  call moves or casts it, not the parameter.

It fires when the attribute is read outside `__init__` (in `forward` or
another method) or never read at all (an in-place initialisation in
`__init__`, `nn.init.xavier_normal_(self.w)` or `self.w.uniform_()`, is no
read; every definition of a class a notebook defines twice is checked), and no `nn.ModuleList`, `ModuleDict`,
`Sequential`, `ParameterList`, `Parameter`, `register_buffer` or
`register_parameter` wraps it anywhere in the class. It stays silent on MLX,
Flax and Haiku modules (their `nn` registers lists), on `nn.Sequential(*self.layers)`
stored in the class (one built and called at once in `forward`,
`nn.Sequential(*self.layers)(x)`, registers nothing and does not count),
on lists of functions or stateless layers (`[F.relu, torch.tanh]`,
`[nn.ReLU(), nn.Tanh()]`, or instances of a same-file module class that
holds nothing else: Autoformer's `series_decomp` around an `nn.AvgPool1d`), on tensors without `requires_grad=True`, when
the class registers its layers itself (`add_module`, `setattr(self, ...)`,
`self.__setattr__(...)`, or each element's parameters with `register_parameter` in a loop over
the list, directly or through a method of the class), on modules the file
freezes before storing them (`for p in model.parameters(): p.requires_grad =
False`, `model.requires_grad_(False)`: a blender's pretrained members, kept
out of its parameters and `state_dict` on purpose),
when the class overrides `parameters()` (it hands its tensors to the optimizer
itself), and when the container itself, or one of its elements, is handed to an
object the file cannot see into (`Block(self.layers)`; a layer's output passed on,
`self.head(self.layers[0](x))`, hands nothing over).

## Why is this bad?
`nn.Module.__setattr__` registers only `nn.Module` and `nn.Parameter` values.
Modules inside a Python list or dict, and plain tensors, are invisible to
`model.parameters()`, so the optimizer never updates them (measured: 0 of 3
hidden layers updated); `state_dict()` does not save them, `.to(device)`,
`.double()` and `.eval()` do not reach them (a dropout kept in a list stays
active at evaluation, namnisan/mt-dnn #45). Training runs without an error.

## Example
```python
from torch import nn


class MLP(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.layers = [nn.Linear(64, 64) for _ in range(depth)]

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return x
```

## Use instead
```python
from torch import nn


class MLP(nn.Module):
    def __init__(self, depth):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x).relu()
        return x
```

Use `nn.ModuleDict` for a dict of layers, `nn.Parameter(torch.randn(...))` for
a trainable tensor and `nn.ParameterList` for a list of them.

## References
- [torch.nn.Module](https://pytorch.org/docs/stable/generated/torch.nn.Module.html)
- [torch.nn.ModuleList](https://pytorch.org/docs/stable/generated/torch.nn.ModuleList.html)
- [torch.nn.ModuleDict](https://pytorch.org/docs/stable/generated/torch.nn.ModuleDict.html)
- [torch.nn.parameter.Parameter](https://pytorch.org/docs/stable/generated/torch.nn.parameter.Parameter.html)
- [torch.nn.ParameterList](https://pytorch.org/docs/stable/generated/torch.nn.ParameterList.html)
"""

    # -- what an expression holds ------------------------------------------------------------------
    def _item(self, model: FileModel, node: cst.BaseExpression, at: _Located, init: Scope) -> Optional[str]:
        """``"nn.Linear"``-style text when ``node`` is a stateful module constructor (directly or
        through a local name nobody else registers), ``"tensor"`` for a requires_grad tensor."""
        if isinstance(node, cst.Name):
            b = model.reaching_binding(node.value, at)
            if b is None or b.value is None or b.kind not in ("assign", "annassign") or b.unpacked:
                return None
            if self._registered_elsewhere(model, node.value, init):
                return None
            if frozen_module(model, node.value):
                return None  # a frozen, separately loaded model kept out of the parent on purpose (an ensemble)
            node = b.value
        node = unwrap(node, MODULE_RETURNING_METHODS)  # ``nn.Linear(a, b).cuda()``: the module itself
        if is_stateful_module_ctor(model, node):
            assert isinstance(node, cst.Call)
            name = nn_layer_name(model, node)
            return f"nn.{name}" if name else f"{model.module.code_for_node(node.func)}"
        if is_requires_grad_tensor(model, node):
            return "tensor"
        return None

    @staticmethod
    def _registered_elsewhere(model: FileModel, name: str, init: Scope) -> bool:
        """The local ``name`` is also assigned to an attribute (``self.fc = layer``): registered there."""
        for a in model.assigns_in_scope(init):
            if isinstance(a.value, cst.Name) and a.value.value == name and any(t.kind == "attr" for t in a.targets):
                return True
        return False

    def _held(self, model: FileModel, value: cst.BaseExpression, at: Assign, init: Scope,
              attr: str) -> Optional[_Held]:
        if is_requires_grad_tensor(model, value):
            return _Held("tensor", "requires_grad tensor", "")
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) \
                and value.func.attr.value in _CONVERSIONS and nn_layer_name(model, value.func.value) == "Parameter" \
                and not _float32_already(model, value):
            return _Held("converted", f"nn.Parameter(...).{value.func.attr.value}(...)", "")
        found = _elements(value)
        local = None
        origins: list[Assign] = [at]  # the bindings the container was made by
        if found is None and isinstance(value, cst.Name):
            local = value.value
            b = model.reaching_binding(local, at)
            if b is None or b.value is None or b.kind not in ("assign", "annassign"):
                return None
            found = _elements(b.value)
            origins.append(b)
        if found is None:
            return None
        container, values = found
        items: list[tuple[cst.BaseExpression, _Located]] = [(v, at) for v in values]
        builders = {attr} | ({local} if local else set())
        for c in model.calls_in_scope(init):
            if c.method in LIST_ADDS and c.receiver_text in builders and c.node.args:
                arg = c.node.args[-1].value
                more = _elements(arg)
                items.extend((v, c) for v in (more[1] if more and c.method == "extend" else [arg]))
        for a in model.assigns_in_scope(init):
            if a.kind == "augassign" and a.op == "+=" and any(t.text in builders for t in a.targets) and a.value:
                more = _elements(a.value)
                if more:
                    items.extend((v, a) for v in more[1])
            elif a.kind == "assign" and a.value is not None and len(a.targets) == 1 \
                    and a.targets[0].kind == "subscript" and a.targets[0].container in builders \
                    and any(b is o for b in model.reaching_bindings(a.targets[0].container, a) for o in origins):
                # ``self.summers[i] = nn.Linear(...)`` into this list (not into a ModuleDict bound elsewhere), or
                # ``layers[i] = nn.Linear(...)`` into the local list later stored as ``self.layers = layers``
                items.append((a.value, a))
        for item, where in items:
            what = self._item(model, item, where, init)
            if what == "tensor":
                return _Held("tensors", "requires_grad tensors", container)
            if what:
                return _Held("modules", what, container)
        return None

    # -- class-wide facts ------------------------------------------------------------------------
    @staticmethod
    def _class_scope(model: FileModel, info: ClassInfo) -> Optional[Scope]:
        for s in model.scopes:
            if s.kind == "class" and s.node is info.node:
                return s
        return None

    @staticmethod
    def _registers_itself(model: FileModel, init: Scope, me: str) -> bool:
        for c in model.calls_within(init.order, init.end):
            if c.method in ("add_module", "register_module", "__setattr__") and c.receiver_text == me:
                return True
            if c.func_text == "setattr" and c.node.args and names_in(c.node.args[0].value) == {me}:
                return True
        return False

    @staticmethod
    def _handed_over(model: FileModel, cls: Scope, texts: set[str]) -> bool:
        """A call in the class wraps, registers or receives one of ``texts`` as an argument."""
        for c in model.calls_within(cls.order, cls.end):
            args: set[str] = set()
            for a in c.node.args:
                args |= names_in(a.value)
            if not args & texts:
                continue
            qn = c.qualname or ""
            if qn in _WRAPPERS and called_at_once(c):
                continue  # ``nn.Sequential(*self.layers)(x)`` in forward: a throwaway container registers nothing
            if qn in _WRAPPERS or c.method in _REGISTER_METHODS or qn.startswith("torch.optim."):
                return True  # registered, or handed to an optimizer of its own
            if qn in _READERS or qn.startswith("torch.") or c.method in LIST_ADDS:
                continue
            if c.receiver_text in texts:
                continue  # self.layers.index(x), self.layers.append(...)
            if not any(_hands_over(a.value, texts) for a in c.node.args):
                continue  # ``self.head(self.models[0](x))``: the callee gets an output or an element, not the container
            return True  # e.g. Block(self.layers): the callee may register it
        return False

    @staticmethod
    def _registered_through_loop(model: FileModel, cls: Scope, text: str) -> bool:
        """The class registers the parameters of each element by hand: ``for i, m in
        enumerate(self.linear): self._add_to_parameters(m.parameters(), ...)`` where the
        call, or the same-file method it resolves to, calls ``register_parameter``
        (pytorch_RVAE's ``Highway``)."""
        for a in model.assigns_within(cls.order, cls.end):
            if a.kind != "for" or a.value is None or text not in names_in(a.value):
                continue
            loop_vars = {t.text for t in a.targets if t.kind == "name" and t.text}
            for c in model.calls_within(cls.order, cls.end):
                if not any(loop.node is a.statement for loop in c.loops):
                    continue  # only the body of this loop over the list
                args = {n for arg in c.node.args for n in names_in(arg.value)}
                if not any(n.split(".")[0] in loop_vars for n in args):
                    continue
                if c.method in _REGISTER_METHODS or any(
                        k.method in _REGISTER_METHODS for callee in model.resolve_callee(c)
                        for k in model.calls_within(callee.order, callee.end)):
                    return True
        return False

    @staticmethod
    def _reads(model: FileModel, info: ClassInfo, attr: str, writes: set[int]) -> set[str]:
        """Names of the methods that read ``attr`` (assignment targets and builders excluded)."""
        out: set[str] = set()
        for name, method in info.methods.items():
            for n in walk(method.node):
                if isinstance(n, cst.Attribute) and id(n) not in writes and n.attr.value == attr.split(".")[-1] \
                        and isinstance(n.value, cst.Name) and n.value.value == attr.split(".")[0]:
                    out.add(name)
                    break
        return out

    # -- check -----------------------------------------------------------------------------------
    def check(self, model: FileModel) -> Iterator[Finding]:
        for info in [c for versions in model.class_versions.values() for c in versions]:  # redefinitions too
            init = info.methods.get("__init__")
            if init is None or not is_torch_module_class(model, info.name, lenient=True):
                continue
            me = self_name(init)
            cls = self._class_scope(model, info)
            if me is None or cls is None or "parameters" in info.methods or "named_parameters" in info.methods:
                continue  # a class that lists its own parameters hands them to the optimizer itself
            for a in model.assigns_in_scope(init):
                if a.kind not in ("assign", "annassign") or a.unpacked or len(a.targets) != 1 or a.value is None:
                    continue
                t = a.targets[0]
                if t.kind != "attr" or not t.text or t.text.count(".") != 1 or not t.text.startswith(me + "."):
                    continue
                held = self._held(model, a.value, a, init, t.text)
                if held is None:
                    continue
                if held.kind != "tensor" and self._registers_itself(model, init, me):
                    continue
                texts = {t.text} | ({a.value.value} if isinstance(a.value, cst.Name) else set())
                if self._handed_over(model, cls, texts) or self._registered_through_loop(model, cls, t.text):
                    continue
                writes = {id(x.node) for b in model.assigns_within(cls.order, cls.end) for x in b.targets
                          if x.text == t.text}
                writes |= {id(c.receiver) for c in model.calls_in_scope(init)
                           if c.receiver_text == t.text and c.method in LIST_ADDS}
                writes |= _initialised(model, init, t.text)
                reads = self._reads(model, info, t.text, writes)
                if reads == {"__init__"}:
                    continue  # used only while building: what it became is decided there
                yield Finding(a.node, self._message(t.text, held))

    @staticmethod
    def _message(attr: str, held: _Held) -> str:
        if held.kind == "converted":
            return (f"`{attr}` is `{held.example}`: a parameter moved to another device or dtype is a new plain "
                    f"tensor (not a leaf), so `model.parameters()` (so the optimizer) and `state_dict()` never see "
                    f"it and its `.grad` stays None; wrap the converted tensor instead "
                    f"(`nn.Parameter(torch.tensor(...).to(device))`) or move the whole module")
        if held.kind == "tensor":
            return (f"`{attr}` is a plain tensor with `requires_grad=True`, not a parameter: `model.parameters()` "
                    f"(so the optimizer), `state_dict()` and `.to()` never see it; wrap it in `nn.Parameter(...)`")
        wrapper = {"modules": {"list": "nn.ModuleList", "dict": "nn.ModuleDict"},
                   "tensors": {"list": "nn.ParameterList", "dict": "nn.ParameterDict"}}[held.kind][held.container]
        what = f"`{held.example}` modules" if held.kind == "modules" else held.example
        return (f"`{attr}` keeps {what} in a plain {held.container}, which `nn.Module` does not register: "
                f"`model.parameters()` (so the optimizer), `state_dict()`, `.to()` and `.eval()` never reach them; "
                f"use `{wrapper}(...)`")
