"""TGL303 softmax-into-ce-loss."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ..analysis.model import Call, FileModel, Scope, _Located, argument_for
from ..analysis.modes import module_classes, saved_objects, unwrap
from ..analysis.provenance import call_fact
from ..analysis.names import dotted_name
from ..analysis.tree import walk
from ..analysis.torch_api import (BCE_LOGITS, CE, LOGIT_LOSS_FUNCTIONS, LOGIT_LOSS_MODULES, NLL,
                                  PROBABILITY_FUNCTIONS, PROBABILITY_MODULES, SIGMOID, SOFTMAX)
from ..registry import Finding, Rule

_SEQUENTIAL = frozenset({"torch.nn.Sequential", "torch.nn.modules.container.Sequential"})
#: which probabilities each loss must not be fed (a sigmoid squashes every logit into (0, 1) as a
#: softmax does: cross-entropy's log_softmax of them has the same floor)
_WRONG_INPUT = {CE: (SOFTMAX, SIGMOID), NLL: (SOFTMAX, SIGMOID), BCE_LOGITS: (SIGMOID,)}
#: methods whose result holds (some of) the receiver's values, unchanged
_SAME_VALUES = frozenset({"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "contiguous", "squeeze",
                          "unsqueeze", "view", "view_as", "reshape", "reshape_as", "flatten", "permute", "transpose",
                          "t", "expand", "expand_as", "narrow", "select", "clone", "gather", "take_along_dim",
                          "index_select", "masked_select"})
#: calls whose first result holds values picked from their input (``values, indices = p.topk(k)``)
_VALUE_PICKS = frozenset({"torch.topk", "torch.sort", "torch.max", "torch.min", "torch.kthvalue", "torch.median"})
_VALUE_PICK_METHODS = frozenset({"topk", "sort", "max", "min", "kthvalue", "median"})
#: module wrappers whose forward is the wrapped module's
_WRAPPERS = frozenset({"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                       "torch.nn.parallel.DistributedDataParallel"})
_MAX_DEPTH = 12
#: functions that pick elements of a tensor (probabilities stay probabilities)
_PICKS = frozenset({"torch.gather", "torch.take_along_dim", "torch.index_select", "torch.masked_select"})


class _Resolver:
    """Follows names, ``self`` attributes, parameters (through same-file callers and defaults) to the
    expression that made a value, and classifies values as softmax/sigmoid outputs."""

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self._forward_kind: dict[tuple, Optional[str]] = {}
        self._loading: set[int] = set()  # ids of the torch.load calls being resolved

    # -- where a name's value comes from -------------------------------------------------------
    def origins(self, node: cst.BaseExpression, at: _Located, depth: int) -> Optional[list[tuple]]:
        """``(expression, location, binding kind)`` triples that may give ``node`` its value, or ``None``
        when unknown. A parameter's origins are its same-file call sites' arguments (all of them) or
        else its default."""
        model = self.model
        text = dotted_name(node)
        if text is None or depth > _MAX_DEPTH:
            return None
        if text.startswith("self.") and text.count(".") == 1:
            return self._self_attr(text, at, depth)
        if "." in text:
            return None
        binding = model.reaching_binding(text, at)
        if binding is not None and binding.kind != "param":
            return _origin(binding, text)
        if binding is None and at.scope is model.module_scope:
            # script code: ``model = Net()`` then ``try: model = torch.load(ckpt)`` in a later cell;
            # every binding that may reach ``at`` must resolve (and agree, for a kind)
            found = []
            for b in model.reaching_bindings(text, at):
                origin = _origin(b, text) if b.kind != "param" else None
                if origin is None:
                    return None
                found.extend(origin)
            if found:
                return found
        fn = model.enclosing_function(at.scope)
        if fn is None or text not in fn.params or binding is None and any(
                a.order < at.order for a in model.bindings_of(text, at.scope)):
            return None
        return self._param(fn, text, depth)

    def _self_attr(self, text: str, at: _Located, depth: int) -> Optional[list[tuple]]:
        fn = self.model.enclosing_function(at.scope)
        cls = fn.class_name if fn is not None else None
        if cls is None or cls not in self.model.classes:
            return None
        out = []
        for method in self.model.classes[cls].methods.values():
            for a in self.model.bindings_of(text, method):
                if a.kind not in ("assign", "annassign") or a.value is None or a.unpacked:
                    return None
                out.append((a.value, a, a.kind))
        return out or None

    def _param(self, fn: Scope, name: str, depth: int) -> Optional[list[tuple]]:
        model = self.model
        out = []
        for call in model.callers_of(fn):  # a method's callers too (``self.surrogate(..., self.actor)``)
            arg = argument_for(call, fn, name)
            if arg is None:
                out = []
                break
            out.append((arg, call, "arg"))
        if out:
            return out
        node = fn.node
        if isinstance(node, cst.FunctionDef):
            for p in [*node.params.posonly_params, *node.params.params, *node.params.kwonly_params]:
                if p.name.value == name and p.default is not None:
                    return [(p.default, _at_scope(fn), "default")]
        return None

    # -- constructors ----------------------------------------------------------------------------
    def constructors(self, node: cst.BaseExpression, at: _Located, depth: int = 0,
                     index: Optional[int] = None) -> Optional[list[tuple]]:
        """The constructor calls (``nn.Softmax(dim=1)``, ``Net()``...) a module-valued expression comes
        from, with their locations; ``None`` if any origin is not a constructor call. A
        ``torch.load(path)`` of what the file itself saves there (``torch.save([gen, disc], path)``;
        ``index``: the element an unpacking takes) stands for the saved modules."""
        if depth > _MAX_DEPTH:
            return None
        node = unwrap(node)
        if isinstance(node, cst.Call) and self.model.qualname(node.func) == "torch.load":
            return self._loaded(node, depth, index)
        if index is not None:
            return None
        if isinstance(node, cst.Call):
            return [(node, at)]
        origins = self.origins(node, at, depth + 1)
        if not origins:
            return None
        out = []
        for expr, where, kind in origins:
            if kind == "for":
                return None
            found = self.constructors(expr, where, depth + 1, kind if isinstance(kind, int) else None)
            if found is None:
                return None
            out.extend(found)
        return out or None

    def _loaded(self, load: cst.Call, depth: int, index: Optional[int]) -> Optional[list[tuple]]:
        if id(load) in self._loading:
            return []  # the load of a load: adds no constructor
        saves = saved_objects(self.model, load)
        if saves is None:
            return None
        self._loading.add(id(load))
        try:
            out = []
            for obj, where in saves:
                obj = unwrap(obj)
                if index is not None:
                    obj = _element(obj, index, (cst.Tuple, cst.List))  # ``torch.save([gen, disc], path)``
                    if obj is None:
                        return None
                found = self.constructors(obj, where, depth + 1)
                if found is None:
                    return None
                out.extend(found)
            return out
        finally:
            self._loading.discard(id(load))

    def module_kind(self, node: cst.BaseExpression, at: _Located, depth: int = 0,
                    index: Optional[int] = None) -> Optional[str]:
        """:data:`SOFTMAX`/:data:`SIGMOID` when the module ``node`` outputs probabilities: an
        ``nn.Softmax``/``nn.Sigmoid``, a ``Sequential`` ending in one, a same-file module whose
        ``forward`` always returns them. With ``index``: element ``index`` of the tuple every
        ``forward`` of the same-file module classes it is built from returns."""
        if isinstance(node, cst.Name) and node.value == "self":  # self.forward(x) in a method of the module
            fn = self.model.enclosing_function(at.scope)
            cls = fn.class_name if fn is not None else None
            return self.forward_kind(cls, index) if cls in module_classes(self.model) else None
        ctors = self.constructors(node, at, depth)
        if not ctors:
            return None
        kinds = {self._ctor_kind(c, where, depth, index) for c, where in ctors}
        return kinds.pop() if len(kinds) == 1 else None

    def _ctor_kind(self, call: cst.Call, at: _Located, depth: int, index: Optional[int] = None) -> Optional[str]:
        qn = self.model.qualname(call.func) or ""
        positional = [a.value for a in call.args if a.keyword is None and not a.star]
        if qn in _WRAPPERS:  # nn.DataParallel(Net()): the forward is Net's
            return self.module_kind(positional[0], at, depth + 1, index) if positional else None
        if "." not in qn and qn in module_classes(self.model):
            return self.forward_kind(qn, index)
        if index is not None:
            return None  # a layer's output is one tensor, not a tuple of outputs
        if qn in PROBABILITY_MODULES:
            return PROBABILITY_MODULES[qn]
        if qn in _SEQUENTIAL:
            return self.module_kind(positional[-1], at, depth + 1) if positional else None
        return None

    def element_kind(self, call: cst.BaseExpression, at: _Located, index: int, depth: int) -> Optional[str]:
        """The probability kind of element ``index`` of what the module call ``call`` returns
        (``score, label = disc(x)``), when every ``return`` of each same-file module class's
        ``forward`` gives a tuple with that element; else ``None``."""
        call = unwrap(call)
        if not isinstance(call, cst.Call) or depth > _MAX_DEPTH:
            return None
        func = call.func
        qn = self.model.qualname(func) or ""
        if index == 0 and (qn in _VALUE_PICKS or isinstance(func, cst.Attribute) and not qn.startswith("torch.")
                           and func.attr.value in _VALUE_PICK_METHODS):
            # ``probs, idx = p.topk(k)``: the values are probabilities picked from ``p``
            source = call.args[0].value if qn in _VALUE_PICKS and call.args else func.value
            return self.prob_kind(source, at, depth + 1) if isinstance(func, cst.Attribute) or call.args else None
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        return self.module_kind(func, at, depth + 1, index)

    def _returned_kind(self, node: cst.Call, depth: int) -> Optional[str]:
        """The probability kind every ``return`` of the same-file function or method ``node`` calls
        gives (``probs = self._decode(x)`` with ``return F.softmax(...)``), else ``None``."""
        model = self.model
        call = call_fact(model, node)
        scopes = model.resolve_callee(call) if call is not None else []
        if len(scopes) != 1 or scopes[0].kind != "function" or scopes[0].name == "forward":
            return None
        key = ("returns", id(scopes[0]))
        if key in self._forward_kind:
            return self._forward_kind[key]
        self._forward_kind[key] = None  # recursion guard
        returns = model.returns_of(scopes[0])
        kinds = {self.prob_kind(r.value, r, depth + 1) if r.value is not None else None for r in returns}
        result = kinds.pop() if len(kinds) == 1 else None
        self._forward_kind[key] = result
        return result

    def forward_kind(self, cls: str, index: Optional[int] = None) -> Optional[str]:
        """The probability kind every ``return`` of ``cls.forward`` gives (with ``index``: element
        ``index`` of the tuple every ``return`` gives), else ``None``."""
        key = (cls, index)
        if key in self._forward_kind:
            return self._forward_kind[key]
        self._forward_kind[key] = None  # recursion guard
        scope = self.model._method(cls, "forward", set())
        kinds = set()
        if scope is not None:
            for node in walk(scope.node):
                if isinstance(node, cst.Return):
                    at = _first_fact_after(self.model, scope, node)
                    value = node.value if index is None else _element(node.value, index, (cst.Tuple,))
                    kinds.add(self.prob_kind(value, at, 1) if value is not None and at else None)
        result = kinds.pop() if len(kinds) == 1 else None
        self._forward_kind[key] = result
        return result

    # -- values --------------------------------------------------------------------------------
    def prob_kind(self, node: Optional[cst.BaseExpression], at: _Located, depth: int = 0) -> Optional[str]:
        """:data:`SOFTMAX`/:data:`SIGMOID` when ``node`` is such an output (also a row, a slice, or an
        element of one); ``None`` when it is not or unknown."""
        if node is None or depth > _MAX_DEPTH:
            return None
        if isinstance(node, cst.Subscript):
            return self.prob_kind(node.value, at, depth + 1)
        if isinstance(node, cst.Call):
            return self._call_kind(node, at, depth)
        if isinstance(node, (cst.Name, cst.Attribute)):
            origins = self.origins(node, at, depth + 1)
            if not origins:
                return None
            kinds = {self.element_kind(expr, where, kind, depth + 1) if isinstance(kind, int)
                     else self.prob_kind(expr, where, depth + 1) for expr, where, kind in origins}
            return kinds.pop() if len(kinds) == 1 else None
        return None

    def _call_kind(self, node: cst.Call, at: _Located, depth: int) -> Optional[str]:
        model = self.model
        qn = model.qualname(node.func) or ""
        if qn in PROBABILITY_FUNCTIONS:
            return PROBABILITY_FUNCTIONS[qn]
        if qn in _PICKS and node.args:  # torch.gather(probs, 1, idx): the target's probability
            return self.prob_kind(node.args[0].value, at, depth + 1)
        func = node.func
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            head = dotted_name(func.value)
            if method == "forward" and head is not None:  # model.forward(x): the module's output
                return self.module_kind(func.value, at, depth + 1)
            imported = head is not None and head.split(".")[0] in model.names.aliases
            if method in (SOFTMAX, SIGMOID) and not imported:
                return method  # x.softmax(dim=-1)
            if method in _SAME_VALUES:
                return self.prob_kind(func.value, at, depth + 1)
        if isinstance(func, cst.Call):  # nn.Softmax(dim=1)(z)
            return self._ctor_kind(func, at, depth + 1)
        if qn.startswith("torch.") or dotted_name(func) is None:
            return None
        kind = self.module_kind(func, at, depth + 1)
        if kind is not None:
            return kind
        kind = self._returned_kind(node, depth)
        if kind is not None:
            return kind
        for arg in node.args:  # a wrapper handed the layer that produces the output: cd(x, Seq(fc, Softmax))
            if isinstance(arg.value, cst.Call) and (model.qualname(arg.value.func) or "") in _SEQUENTIAL:
                kind = self._ctor_kind(arg.value, at, depth + 1)
                if kind is not None:
                    return kind
        return None

    def loss_kind(self, call: Call) -> Optional[str]:
        """Which loss ``call`` computes: a functional loss or an instance of a loss module."""
        if call.qualname in LOGIT_LOSS_FUNCTIONS:
            return LOGIT_LOSS_FUNCTIONS[call.qualname]
        if call.qualname and call.qualname.startswith("torch."):
            return None
        ctors = self.constructors(call.node.func, call)
        if not ctors:
            return None
        kinds = {LOGIT_LOSS_MODULES.get(self.model.qualname(c.func) or "") for c, _ in ctors}
        return kinds.pop() if len(kinds) == 1 else None


def _element(node: Optional[cst.BaseExpression], index: int, displays: tuple) -> Optional[cst.BaseExpression]:
    """Element ``index`` of ``node`` when it is a display of one of the ``displays`` types and that
    element is not starred, else ``None``."""
    if not isinstance(node, displays) or index >= len(node.elements) \
            or isinstance(node.elements[index], cst.StarredElement):
        return None
    return node.elements[index].value


def _origin(binding, text: str) -> Optional[list[tuple]]:
    """``[(value, binding, kind)]`` for a binding the resolver follows (``kind``: the binding's
    kind, or for an unpacking the element's position), else ``None``."""
    if binding.unpacked and binding.kind == "assign" and binding.op is None:
        index = _element_index(binding, text)
        return None if index is None else [(binding.value, binding, index)]
    if binding.value is None or binding.unpacked or binding.op is not None \
            or binding.kind not in ("assign", "annassign", "for", "walrus"):
        return None
    return [(binding.value, binding, binding.kind)]


def _element_index(binding, text: str) -> Optional[int]:
    """The position of ``text`` in the flat tuple/list target of the unpacking ``binding``
    (``score, label = disc(x)``: 1 for ``label``), else ``None`` (nested or starred targets)."""
    node = binding.node
    if not isinstance(node, cst.Assign) or len(node.targets) != 1:
        return None
    target = node.targets[0].target
    if not isinstance(target, (cst.Tuple, cst.List)):
        return None
    for i, element in enumerate(target.elements):
        if isinstance(element, cst.StarredElement):
            return None
        if dotted_name(element.value) == text:
            return i
    return None


def _at_scope(scope: Scope) -> _Located:
    """A location at the start of ``scope`` (for evaluating a parameter default)."""
    return _Located(scope.parent or scope, scope.order, (), (), None, scope.node)


def _first_fact_after(model: FileModel, scope: Scope, node: cst.CSTNode) -> Optional[_Located]:
    """A fact in ``scope`` that lies in the statement ``node`` (to evaluate ``return`` expressions), or
    a synthetic location at the end of the scope."""
    for c in model.calls_in_scope(scope):
        if c.statement is node:
            return c
    later = [a for a in model.assigns_in_scope(scope)]
    if later:
        last = later[-1]
        return _Located(scope, scope.end, last.loops, last.blocks[:1], None, node)
    return _Located(scope, scope.end, (), (), None, node)


def _loss_candidates(model: FileModel):
    """A cheap test of which calls may call a loss module instance, so that only those are resolved:
    the callee is bound to a loss constructor somewhere in the file (directly, or through a name that
    is bound to one or is a parameter defaulting to one), or is a parameter of its function when the
    file builds a loss module at all."""
    texts: set[str] = set()
    for a in model.assigns:
        value = unwrap(a.value)
        if isinstance(value, cst.Call) and (model.qualname(value.func) or "") in LOGIT_LOSS_MODULES:
            texts.update(t.text for t in a.targets if t.text)
    for scope in model.scopes:
        node = scope.node
        if isinstance(node, cst.FunctionDef):
            for p in [*node.params.posonly_params, *node.params.params, *node.params.kwonly_params]:
                if isinstance(p.default, cst.Call) and (model.qualname(p.default.func) or "") in LOGIT_LOSS_MODULES:
                    texts.add(p.name.value)
    if not texts:
        return lambda call: False
    for a in model.assigns:
        if isinstance(a.value, cst.Name) and a.value.value in texts:
            texts.update(t.text for t in a.targets if t.text)

    def candidate(call: Call) -> bool:
        text = call.func_text or ""
        if text in texts:
            return True
        fn = model.enclosing_function(call.scope)
        return fn is not None and text in fn.params
    return candidate


def _shown(model: FileModel, node: cst.CSTNode) -> str:
    text = model.module.code_for_node(node)
    if len(text) <= 40:
        return f"`{text}`"
    if isinstance(node, cst.Call):  # ``torch.gather(inp, 1, target.view(-1, 1)).squeeze(1)``: name its head
        head = dotted_name(node.func)
        if head is not None and len(head) <= 40:
            return f"`{head}(...)`"
        if isinstance(node.func, cst.Attribute) and isinstance(node.func.value, cst.Call):
            return _shown(model, node.func.value)
    return "the input"


class SoftmaxIntoCeLoss(Rule):
    """Probabilities fed to a loss that expects logits (or log-probabilities).

    Rests on: ``torch.nn.CrossEntropyLoss`` / ``torch.nn.functional.cross_entropy`` ("The input is
    expected to contain the unnormalized logits for each class"), ``torch.nn.NLLLoss`` ("The input
    ... is expected to contain log-probabilities"), ``torch.nn.BCEWithLogitsLoss`` ("combines a Sigmoid
    layer and the BCELoss in one single class") and ``torch.nn.functional.log_softmax`` ("While
    mathematically equivalent to log(softmax(x)), doing these two operations separately is slower and
    numerically unstable").
    """

    code = "TGL303"
    name = "softmax-into-ce-loss"
    summary = "softmax/sigmoid probabilities passed to CrossEntropyLoss/NLLLoss/*WithLogits, or log(softmax())"
    probe = "probability-input"
    # a probability source, and a loss that takes logits or a log (``log as`` covers ``from torch import
    # log as ln``)
    prefilter = (("softmax", "Softmax", "sigmoid", "Sigmoid", "expit"),
                 ("cross_entropy", "CrossEntropyLoss", "nll_loss", "NLLLoss", "with_logits", "WithLogits", "log(",
                  ".log()", "log as"))
    ast_prefilter = "probabilities-into-loss"  # a softmax/sigmoid call and a logits loss or log call
    docs = """
## What it does
Checks the input (first argument) of `nn.CrossEntropyLoss` instances and
`F.cross_entropy`, and of `nn.NLLLoss` / `F.nll_loss`, for a softmax or
sigmoid output: `F.softmax`, `torch.softmax`, `x.softmax(dim)`,
`torch.sigmoid`, an `nn.Softmax` / `nn.Sigmoid` module, a `Sequential` ending
in one, or a same-file model whose `forward` always returns one (or returns a
tuple whose element the loss takes: `score, code = disc(x)`) — followed
through local variables, loop variables over the probabilities, `self`
attributes, arguments of same-file callers, `model.forward(x)`, wrappers
(`nn.DataParallel(Net())`) and a checkpoint the file restores from what it
saved itself (`torch.save([gen, disc], path)` ... `gen, disc =
torch.load(path)`). It also checks the input of `nn.BCEWithLogitsLoss` /
`F.binary_cross_entropy_with_logits` for a sigmoid output, and flags
`torch.log(softmax(...))` / `softmax(...).log()`, also of probabilities
picked from a softmax output (`-torch.log(torch.gather(probs, 1, target))`
in a loss helper, as the chatbot tutorial writes its masked NLL).

It stays silent on softmax fed to `MSELoss`, `KLDivLoss` (as the target) or
metrics, on softmax used for `argmax`, on `log_softmax` into CE (harmless),
on probabilities passed as the *target* (soft labels, distillation), and on a
model whose `forward` returns logits in training and probabilities only in
another branch.

## Why is this bad?
`cross_entropy` applies `log_softmax` to its input. Given probabilities it
computes the softmax of probabilities: the loss can never fall below a floor
(1.461 for 10 classes), and the gradient of a confidently wrong sample is
about 10,000x smaller than with logits (measured 1.19e-4 vs 1.414), so
training slows to a crawl and ends less accurate (train accuracy 0.893 vs
0.997 on the same data). `NLLLoss` expects log-probabilities; fed
probabilities it optimises the wrong quantity. A sigmoid into cross-entropy
(a 10-way code head ending in `nn.Sigmoid`, as InfoGAN tutorials write it)
squashes every logit into (0, 1): the same floor of 1.461 nats for 10
classes. A sigmoid into
`BCEWithLogitsLoss` is squashed twice (gradient 4,080x smaller, floor 0.693).
`log(softmax(x))` underflows to `-inf` for confident logits and gives NaN
gradients; `log_softmax` is exact.

## Example
```python
import torch.nn.functional as F

probs = F.softmax(model(x), dim=1)
loss = F.cross_entropy(probs, y)
```

## Use instead
```python
import torch.nn.functional as F

logits = model(x)
loss = F.cross_entropy(logits, y)
probs = F.softmax(logits, dim=1)  # for metrics only
```

## References
- [torch.nn.CrossEntropyLoss](https://pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html)
- [torch.nn.NLLLoss](https://pytorch.org/docs/stable/generated/torch.nn.NLLLoss.html)
- [torch.nn.BCEWithLogitsLoss](https://pytorch.org/docs/stable/generated/torch.nn.BCEWithLogitsLoss.html)
- [torch.nn.functional.log_softmax](https://pytorch.org/docs/stable/generated/torch.nn.functional.log_softmax.html)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        resolver = _Resolver(model)
        candidates = _loss_candidates(model)
        for call in model.calls:
            if call.qualname == "torch.log" or (call.method == "log" and not call.node.args):
                arg = call.arg(0) if call.qualname == "torch.log" else call.receiver
                if arg is not None and resolver.prob_kind(arg, call) == SOFTMAX:
                    yield Finding(call.node, (
                        f"`log` of the softmax output {_shown(model, arg)}: it underflows to -inf for confident "
                        "logits and gives NaN gradients; use `log_softmax` (F.log_softmax / torch.log_softmax)"))
                continue
            if not call.node.args:
                continue
            inline = isinstance(call.node.func, cst.Call)  # nn.CrossEntropyLoss()(probs, y)
            if not inline and (call.func_text is None or call.qualname not in LOGIT_LOSS_FUNCTIONS
                               and not candidates(call)):
                continue
            loss = resolver.loss_kind(call)
            if loss is None:
                continue
            arg = call.arg(0, "input")
            kind = resolver.prob_kind(arg, call) if arg is not None else None
            if kind not in _WRONG_INPUT[loss]:
                continue
            shown = _shown(model, arg)
            if loss == CE and kind == SIGMOID:
                message = (f"{shown} is a sigmoid output fed to cross-entropy, which applies log_softmax itself: "
                           "values squashed into (0, 1) give the loss a floor (1.461 nats for 10 classes) and "
                           "shrink its gradients; pass the logits (or use BCELoss/BCEWithLogitsLoss for "
                           "independent labels)")
            elif loss == CE:
                message = (f"{shown} is a softmax output fed to cross-entropy, which applies log_softmax itself: "
                           "the loss has a floor and the gradients of confident mistakes shrink ~10,000x; pass the "
                           "logits (take the softmax only for metrics)")
            elif loss == NLL:
                message = (f"{shown} is a {kind} output fed to NLLLoss, which expects log-probabilities; use "
                           "`log_softmax` (or pass the logits to cross_entropy)")
            else:
                message = (f"{shown} is a sigmoid output fed to a *WithLogits loss, which applies the sigmoid "
                           "itself: the gradient shrinks ~4,000x and the loss has a floor of 0.693; pass the logits")
            yield Finding(call.node, message)
