"""Which values are probabilities: softmax or sigmoid outputs, followed to where they are used.

:class:`ProbabilityResolver` answers, for an expression at a place in a
file, whether its value is a softmax or a sigmoid output (:data:`SOFTMAX` /
:data:`SIGMOID` of :mod:`torchgradlint.analysis.torch_api`), following local
variables, loop variables, ``self`` attributes, parameters (through every
same-file caller, else their default), tuple unpacking, module calls (an
``nn.Softmax``, a ``Sequential`` ending in one, a module class whose
``forward`` always returns one, ``nn.DataParallel`` wrappers, a checkpoint
the file restores from what it saved itself), same-file helpers' returns and
calls that keep the values (``.view``, ``torch.gather``, ``topk`` values).
A module class of another project file is asked of the project index
(``model.project.forward_kind``: :mod:`torchgradlint.project_index`
summarises each class's :func:`forward_kinds`). TGL303 uses it.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .model import FileModel, Scope, _Located, argument_for, target_element
from .modes import list_items, module_classes, saved_objects, unwrap
from .names import dotted_name
from .provenance import call_fact
from .torch_api import PROBABILITY_FUNCTIONS, PROBABILITY_MODULES, SAME_FORWARD_WRAPPERS, SIGMOID, SOFTMAX
from .tree import walk

_SEQUENTIAL = frozenset({"torch.nn.Sequential", "torch.nn.modules.container.Sequential"})
#: methods whose result holds (some of) the receiver's values, unchanged
_SAME_VALUES = frozenset({"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "contiguous", "squeeze",
                          "unsqueeze", "view", "view_as", "reshape", "reshape_as", "flatten", "permute", "transpose",
                          "t", "expand", "expand_as", "narrow", "select", "clone", "gather", "take_along_dim",
                          "index_select", "masked_select", "detach"})
#: calls whose first result holds values picked from their input (``values, indices = p.topk(k)``)
_VALUE_PICKS = frozenset({"torch.topk", "torch.sort", "torch.max", "torch.min", "torch.kthvalue", "torch.median"})
_VALUE_PICK_METHODS = frozenset({"topk", "sort", "max", "min", "kthvalue", "median"})
_MAX_DEPTH = 12
_MAX_ELEMENTS = 8  # tuple elements of a forward's result a summary describes
#: functions that pick elements of a tensor (probabilities stay probabilities)
_PICKS = frozenset({"torch.gather", "torch.take_along_dim", "torch.index_select", "torch.masked_select"})


class ProbabilityResolver:
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
        if binding is None and (at.scope is model.module_scope or model.global_in(text, at.scope)):
            # script code: ``model = Net()`` then ``try: model = torch.load(ckpt)`` in a later cell;
            # every binding that may reach ``at`` must resolve (and agree, for a kind). A function
            # reading a global (``criterion(output, y)`` in ``def train(model)``) runs when it is
            # called: every module-level binding of the name may be the one it reads.
            found = []
            for b in (model.reaching_bindings(text, at) if at.scope is model.module_scope
                      else model.bindings_of(text, model.module_scope)):
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
        if qn in SAME_FORWARD_WRAPPERS:  # nn.DataParallel(Net()), torch.compile(net): the forward is Net's
            return self.module_kind(positional[0], at, depth + 1, index) if positional else None
        if "." not in qn and qn in module_classes(self.model):
            return self.forward_kind(qn, index)
        project = self.model.project
        if project is not None and qn and not qn.startswith("torch.") \
                and ("." in qn or project.imports_relatively(qn)):
            kind = project.forward_kind(qn, index)  # a module class of another project file
            if kind is not None:
                return kind
        if index is not None:
            return None  # a layer's output is one tensor, not a tuple of outputs
        if qn in PROBABILITY_MODULES:
            return PROBABILITY_MODULES[qn]
        built = self._factory_kind(call, depth)
        if built is not None:
            return built  # ``get_model()``: what the same-file factory returns
        if qn in _SEQUENTIAL:
            if positional:
                return self.module_kind(positional[-1], at, depth + 1)
            last = _last_unpacked_layer(self.model, call)
            return self.module_kind(last, at, depth + 1) if last is not None else None
        return None

    def _factory_kind(self, node: cst.Call, depth: int) -> Optional[str]:
        """The probability kind of the module every ``return`` of the same-file
        function ``node`` calls gives (``def get_model(): ... return
        nn.Sequential(*layers)``), else ``None``."""
        return self._over_returns(node, depth, "factory", self.module_kind)

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
        kind = self.module_kind(func, at, depth + 1, index)
        if kind is None:  # ``probs, value = self.predict(s)`` with ``return self.model(s)``
            kind = self._over_returns(call, depth, f"element {index}",
                                      lambda v, where, d: self._returned_element(v, where, index, d))
        return kind

    def _returned_element(self, value: cst.BaseExpression, at: _Located, index: int, depth: int) -> Optional[str]:
        """The kind of element ``index`` of a returned value: of a tuple display, or of what a
        returned call gives (:meth:`element_kind`)."""
        element = _element(value, index, (cst.Tuple,))
        if element is not None:
            return self.prob_kind(element, at, depth + 1)
        return self.element_kind(value, at, index, depth)

    def _returned_kind(self, node: cst.Call, depth: int) -> Optional[str]:
        """The probability kind every ``return`` of the same-file function or method ``node`` calls
        gives (``probs = self._decode(x)`` with ``return F.softmax(...)``), else ``None``."""
        return self._over_returns(node, depth, "returns", self.prob_kind)

    def _over_returns(self, node: cst.Call, depth: int, question: str, judge) -> Optional[str]:
        """The one kind ``judge(value, at, depth)`` gives every ``return`` of the same-file function
        (not a ``forward``) that ``node`` calls, else ``None``; memoised per function and
        ``question``, with a guard against recursion."""
        model = self.model
        call = call_fact(model, node)
        scopes = model.resolve_callee(call) if call is not None else []
        if len(scopes) != 1 or scopes[0].kind != "function" or scopes[0].name == "forward" or depth > _MAX_DEPTH:
            return None
        key = (question, id(scopes[0]))
        if key in self._forward_kind:
            return self._forward_kind[key]
        self._forward_kind[key] = None  # recursion guard
        kinds = {judge(r.value, r, depth + 1) if r.value is not None else None for r in model.returns_of(scopes[0])}
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
                if head in ("self", "cls") or self.constructors(func, at, depth + 1):
                    # ``self.softmax(x)``: a layer the file names so (``nn.LogSoftmax(dim=1)``), judged by
                    # what it is built as, or a method judged by what it returns
                    return self.module_kind(func, at, depth + 1) or self._returned_kind(node, depth)
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


def _last_unpacked_layer(model: FileModel, call: cst.Call) -> Optional[cst.BaseExpression]:
    """The last layer of ``nn.Sequential(*layers)`` when ``layers`` is a list the file
    builds in order (a display, then ``append``/``extend`` calls: rasbt's
    ``all_layers.append(nn.Softmax(dim=1))``); ``None`` with an ``insert``."""
    if len(call.args) != 1 or call.args[0].star != "*":
        return None
    name = dotted_name(call.args[0].value)
    if name is None or any(c.receiver_text == name and c.method == "insert" for c in model.calls):
        return None
    items = list_items(model, call.args[0].value)
    return items[-1] if items else None


def forward_kinds(model: FileModel, cls: str) -> Optional[list]:
    """What the ``forward`` of the module class ``cls`` of ``model``'s file returns, for the project
    index's summary: ``[kind, [kind of element 0, ...]]`` with :data:`SOFTMAX`/:data:`SIGMOID`/``None``
    for the whole value every ``return`` gives and for each element of the tuple every ``return``
    gives (up to :data:`_MAX_ELEMENTS`); ``None`` when neither is a probability (or ``cls`` is no
    module class)."""
    if cls not in module_classes(model):
        return None
    resolver = ProbabilityResolver(model)
    scope = model._method(cls, "forward", set())
    width = 0
    if scope is not None:
        for node in walk(scope.node):
            if isinstance(node, cst.Return) and isinstance(node.value, cst.Tuple):
                width = max(width, len(node.value.elements))
    whole = resolver.forward_kind(cls)
    elements = [resolver.forward_kind(cls, i) for i in range(min(width, _MAX_ELEMENTS))]
    return [whole, elements] if whole is not None or any(elements) else None


def _element(node: Optional[cst.BaseExpression], index: int, displays: tuple) -> Optional[cst.BaseExpression]:
    """Element ``index`` of ``node`` when it is a display of one of the ``displays`` types and that
    element is not starred, else ``None``."""
    if not isinstance(node, displays) or index >= len(node.elements) \
            or isinstance(node.elements[index], cst.StarredElement):
        return None
    return node.elements[index].value


def _origin(binding, text: str) -> Optional[list[tuple]]:
    """``[(value, binding, kind)]`` for a binding the resolver follows (``kind``: the binding's
    kind, or for an unpacking the element's position), else ``None``. A loop over
    ``enumerate(p)`` or ``zip(p, q)`` gives its target the rows of the tensor it walks
    (``for i, row in enumerate(probs)``: a row of ``probs``)."""
    if binding.unpacked and binding.kind == "assign" and binding.op is None:
        index = target_element(binding, text)
        return None if index is None else [(binding.value, binding, index)]
    if binding.unpacked and binding.kind == "for" and isinstance(binding.value, cst.Call):
        walked = _walked_by(binding, text)
        return None if walked is None else [(walked, binding, "for")]
    if binding.value is None or binding.unpacked or binding.op is not None \
            or binding.kind not in ("assign", "annassign", "for", "walrus"):
        return None
    return [(binding.value, binding, binding.kind)]


def _walked_by(binding, text: str) -> Optional[cst.BaseExpression]:
    """The sequence whose items the loop target ``text`` takes in ``for i, x in
    enumerate(seq)`` (``x``) or ``for a, b in zip(s, t)`` (``a``: ``s``)."""
    node = binding.node
    target = node.target if isinstance(node, cst.For) else None
    call = binding.value
    if not isinstance(target, (cst.Tuple, cst.List)) or any(a.keyword or a.star for a in call.args):
        return None
    names = [dotted_name(el.value) if not isinstance(el, cst.StarredElement) else None for el in target.elements]
    if text not in names:
        return None
    index = names.index(text)
    func = dotted_name(call.func)
    if func == "enumerate" and len(names) == 2 and index == 1 and call.args:
        return call.args[0].value
    if func == "zip" and len(call.args) == len(names):
        return call.args[index].value
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
