"""Loop-iteration facts: what a tensor expression in a loop body derives from
within one iteration.

Given an expression at a point of a loop body (typically the tensor a backward
runs on), :class:`IterationAnalysis` follows its bindings backwards through
the iteration and answers three questions:

- is the expression *rebuilt* in the iteration: does a forward computation
  (a call or arithmetic) inside the loop lie on its path?
- does it read *carried state*: a name read before its in-loop rebinding,
  so the value flows from the previous iteration (``h = rnn(x, h)``,
  ``hidden = model(x, hidden)``), and not cut by ``.detach()`` at the end of
  the iteration?
- does it read a loop-*invariant* value that may hold a graph built before
  the loop (``y = f(x)`` before ``for i: grad(y[i], x, ...)``), or a value
  whose origin is unknown (a function parameter used as a tensor, an
  ambiguous binding)? Rules treat that as "not rebuilt" and stay silent.

Detaching operations cut the path: ``.detach()``, ``.detach_()``, ``.item()``,
``.tolist()``, ``.numpy()``, ``.data``, ``float(...)``/``int(...)``, a value
computed under ``torch.no_grad()``/``inference_mode()``, and same-file helpers
that call ``.detach()`` (``repackage_hidden(h)``).

PyTorch docs: autograd mechanics ("Saved tensors"), ``torch.Tensor.detach``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional, Union

import libcst as cst

from .model import Assign, Call, FileModel, GradMode, Loop, Scope, _Located, is_literal
from .names import dotted_name
from .torch_api import DETACHING_METHODS
from .training import runs_backward
from .tree import iter_children

DATA, LEAF, OBJECT = "data", "leaf", "object"
# Keyword arguments that never carry a graph into a call's result.
_META_KEYWORDS = frozenset({"device", "dtype", "layout", "non_blocking", "memory_format", "generator",
                            "requires_grad", "pin_memory", "dim", "keepdim", "reduction", "copy"})
_DETACH_METHODS = DETACHING_METHODS | {"detach_"}  # in-place detach cuts the path too
_DETACH_FUNCS = frozenset({"float", "int", "bool", "len", "str", "repr"})
# Calls that create fresh leaf tensors or plain objects, never a graph.
_TORCH_FACTORIES = re.compile(
    r"^torch\.(randn|rand|randint|randperm|zeros|ones|empty|full|eye|arange|linspace|logspace|tensor|"
    r"as_tensor|from_numpy|normal|(zeros|ones|empty|full|rand|randn|randint)_like|manual_seed|device|"
    r"Generator)$"
)
_OBJECT_FUNCS = frozenset({"range", "list", "tuple", "dict", "set", "iter", "enumerate", "zip", "len",
                           "int", "float", "str", "bool", "sorted", "reversed"})
# Methods whose result is graph-free whatever the receiver (module bookkeeping).
_OBJECT_METHODS = frozenset({"parameters", "named_parameters", "buffers", "named_buffers", "children",
                             "modules", "state_dict", "size", "dim", "numel", "keys", "values", "items"})
# Methods that keep a graph-free receiver graph-free (and a module a module).
_PASS_METHODS = frozenset({"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train", "eval",
                           "zero_", "normal_", "uniform_", "fill_", "contiguous", "share_memory_"})
_ITER_WRAPPERS = frozenset({"enumerate", "zip", "iter", "tqdm", "tqdm.tqdm", "tqdm.auto.tqdm",
                            "itertools.islice", "islice", "reversed", "sorted", "list", "tuple",
                            "itertools.cycle", "cycle"})
_DATA_SOURCE = re.compile(r"(loader|data|batch|dataset|sampler|iterator|^dl$|^ds$|_dl$|_ds$)", re.I)
# Parameters used as a method receiver with these names hold objects, not tensors.
_OBJECT_PARAM = re.compile(
    r"(^|_)(model|net|network|module|scaler|accelerator|fabric|criterion|loss_fn|lossfn|encoder|decoder|"
    r"rnn|lstm|gru|cell|layer|layers|policy|critic|actor|generator|discriminator|head|backbone)s?\d*$",
    re.I,
)


@dataclass
class IterationSlice:
    """Where a tensor expression in a loop body comes from, within one iteration.

    ``rebuilt``: a forward computation in the loop lies on its path.
    ``carried``: names whose value flows in from the previous iteration and
    was built by a forward computation there (not detached), mapped to the
    binding that carries them (``h`` -> ``out, h = rnn(x, h)``).
    ``invariant``: names read from outside the loop that may hold a graph.
    ``unknown``: some binding on the path could not be resolved (ambiguous
    branch, unknown origin); callers treat the slice as unreliable.
    """

    rebuilt: bool = False
    carried: dict[str, Assign] = field(default_factory=dict)
    invariant: set[str] = field(default_factory=set)
    unknown: bool = False

    @property
    def fresh_graph(self) -> bool:
        """The graph is rebuilt every iteration from graph-free inputs (or
        from carried state): nothing built before the loop is shared."""
        return self.rebuilt and not self.invariant and not self.unknown


@dataclass
class _Reads:
    names: set[str] = field(default_factory=set)
    forward: bool = False


class IterationAnalysis:
    """Per-file cache and entry point for loop-iteration slices.

    Args:
        model: the file's analysis model (read-only).
    """

    def __init__(self, model: FileModel) -> None:
        self.model = model
        self._calls: dict[int, Call] = {id(c.node): c for c in model.calls}
        self._detach_helpers: dict[int, bool] = {}
        self._reads_cache: dict[int, Optional[_Reads]] = {}

    # -- public -------------------------------------------------------------------
    def slice(self, expr: Optional[cst.BaseExpression], at: _Located, loop: Loop) -> IterationSlice:
        """The :class:`IterationSlice` of ``expr`` read at ``at`` (a fact
        inside ``loop``)."""
        out = IterationSlice()
        if expr is None:
            out.unknown = True
            return out
        reads = self._reads(expr, at.scope)
        out.rebuilt |= reads.forward
        work: list[tuple[str, _Located]] = [(n, at) for n in reads.names]
        seen: set[tuple[str, int]] = set()
        expanded: set[int] = set()
        while work:
            name, point = work.pop()
            if (name, id(point)) in seen:
                continue
            seen.add((name, id(point)))
            for binding, carried in self._resolve(name, point, loop, out):
                if binding.kind == "for" and binding.node is loop.node:
                    if not self._data_source(binding.value, binding, 0):
                        out.invariant.add(name)
                    continue
                if binding.kind in ("param", "with", "for"):
                    out.unknown = True
                    continue
                r = self._binding_reads(binding)
                if r is None:
                    continue
                if r.forward:
                    out.rebuilt = True
                    if carried:
                        out.carried.setdefault(name, binding)
                if id(binding) in expanded:
                    continue
                expanded.add(id(binding))
                work += [(n, binding) for n in r.names]
                if binding.kind == "augassign":
                    work.append((name, binding))
        return out

    def _binding_reads(self, binding: Assign) -> Optional[_Reads]:
        """Reads of a binding's value; ``None`` when the value is computed
        with grad disabled (it holds no graph)."""
        key = id(binding)
        if key not in self._reads_cache:
            if self.model.grad_mode(binding) is GradMode.DISABLED:
                self._reads_cache[key] = None
            else:
                self._reads_cache[key] = self._reads(binding.value, binding.scope)
        return self._reads_cache[key]

    # -- name resolution ---------------------------------------------------------
    def reaching(self, name: str, point: _Located) -> Optional[Assign]:
        """:meth:`FileModel.reaching_binding` (which sees through ``with`` bodies)."""
        return self.model.reaching_binding(name, point)

    def _resolve(self, name: str, point: _Located, loop: Loop,
                 out: IterationSlice) -> list[tuple[Assign, bool]]:
        """In-loop bindings that give ``name`` its value at ``point``, each
        with whether it flows in from the previous iteration. Invariant and
        unresolvable names are recorded in ``out`` and give ``[]``."""
        model = self.model
        inside = [a for a in model.bindings_of(name, point.scope) if loop.order <= a.order <= loop.end]
        if not inside:
            if not self._invariant_graph_free(name, point, loop):
                out.invariant.add(name)
            return []
        before = [a for a in inside if a.order < point.order]
        if before:
            reaching = self.reaching(name, point)
            if reaching is None or reaching not in before:
                out.unknown = True
                return []
            return [(reaching, False)]
        # Read before any rebinding in the body: the value comes from the
        # previous iteration, i.e. from the last binding of the body.
        last = inside[-1]
        body = getattr(loop.node, "body", None)
        if not last.blocks or last.blocks[-1] is not body:
            out.unknown = True  # conditional rebinding (truncated BPTT every k steps)
            return []
        return [(last, True)]

    def _invariant_graph_free(self, name: str, point: _Located, loop: Loop) -> bool:
        """Whether the loop-invariant ``name`` certainly holds no graph."""
        model = self.model
        if model.names.aliases.get(name.split(".")[0]) is not None:
            return True  # an imported module or function
        binding = self.reaching(name, point)
        if binding is not None:
            return self._binding_graph_free(binding, 0)
        if point.scope.kind == "function" and not model.bindings_of(name, point.scope):
            glob = model.bindings_of(name, model.module_scope)  # a module-level global
            return bool(glob) and all(self._binding_graph_free(b, 0) for b in glob)
        return False

    def _binding_graph_free(self, binding: Assign, depth: int) -> bool:
        return self._binding_kind(binding, depth) is not None

    def _value_graph_free(self, value: Optional[cst.BaseExpression], at: _Located, depth: int) -> bool:
        """Literals, torch factories, constructors, ``model.parameters()``,
        ``.to(device)`` of those and arithmetic on plain data: values that
        cannot hold a graph."""
        return self._kind(value, at, depth) is not None

    def _binding_kind(self, binding: Assign, depth: int) -> Optional[str]:
        if depth > 6 or binding.kind == "param":
            return None
        if binding.kind == "for":
            return DATA if self._data_source(binding.value, binding, depth + 1) else None
        if binding.kind not in ("assign", "annassign", "walrus"):
            return None
        if self.model.grad_mode(binding) is GradMode.DISABLED:
            return DATA
        return self._kind(binding.value, binding, depth + 1)

    def _name_kind(self, node: cst.BaseExpression, at: _Located, depth: int) -> Optional[str]:
        text = dotted_name(node)
        if text is None:
            return None
        head = text.split(".")[0]
        if head in ("self", "cls") or self.model.names.aliases.get(head) is not None:
            return OBJECT
        binding = self.reaching(text, at)
        if binding is None and "." in text:
            binding = self.reaching(head, at)
        if binding is None:
            return None
        return self._binding_kind(binding, depth + 1)

    def _kind(self, value: Optional[cst.BaseExpression], at: _Located, depth: int) -> Optional[str]:
        """What a value certainly is: ``DATA`` (plain numbers and tensors
        that do not require grad), ``LEAF`` (a tensor that requires grad but
        has no graph: a parameter, ``randn(..., requires_grad=True)``),
        ``OBJECT`` (a module, optimizer, loader...), or ``None`` when it may
        hold a graph."""
        if value is None or depth > 8:
            return None
        if isinstance(value, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString,
                              cst.ConcatenatedString, cst.FormattedString)):
            return DATA
        if isinstance(value, cst.Name) and value.value in ("None", "True", "False"):
            return DATA
        if isinstance(value, (cst.Name, cst.Attribute)):
            return self._name_kind(value, at, depth)
        if isinstance(value, (cst.Tuple, cst.List, cst.Set)):
            return _join([self._kind(e.value, at, depth + 1) for e in value.elements])
        if isinstance(value, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison, cst.BooleanOperation)):
            parts = [self._kind(c, at, depth + 1) for c in iter_children(value) if isinstance(c, cst.BaseExpression)]
            return DATA if parts and all(k == DATA for k in parts) else None
        if isinstance(value, cst.Subscript):
            return DATA if self._kind(value.value, at, depth + 1) == DATA else None
        if isinstance(value, cst.Call):
            return self._call_kind(value, at, depth)
        return None

    def _call_kind(self, value: cst.Call, at: _Located, depth: int) -> Optional[str]:
        func = value.func
        qn = self.model.qualname(func) or ""
        last = qn.rsplit(".", 1)[-1]
        args = [a.value for a in value.args if a.keyword is None or a.keyword.value not in _META_KEYWORDS]
        if _TORCH_FACTORIES.match(qn):
            rg = next((a.value for a in value.args if a.keyword is not None
                       and a.keyword.value == "requires_grad"), None)
            return DATA if rg is None or is_literal(rg, False) else LEAF
        if qn in ("torch.nn.Parameter", "torch.nn.parameter.Parameter"):
            return LEAF
        if last[:1].isupper():  # a constructor: nn.Linear(...), DataLoader(...), Net()
            return OBJECT
        if isinstance(func, cst.Name) and func.value in _OBJECT_FUNCS:
            return _join([self._kind(a, at, depth + 1) for a in args])
        if isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in _DETACH_METHODS:
                return DATA
            if method in _OBJECT_METHODS:
                return OBJECT
            receiver = self._kind(func.value, at, depth + 1)
            if method in _PASS_METHODS:
                return receiver
            if method == "requires_grad_":
                return LEAF if receiver in (DATA, LEAF) else None
            if qn.startswith("torch.") and not qn.startswith("torch.nn.") or qn.startswith("torch.nn.functional."):
                receiver = DATA  # a torch function: only its arguments matter
            if receiver == DATA and all(self._kind(a, at, depth + 1) == DATA for a in args):
                return DATA  # tensor methods and torch functions on plain data
        return None

    def _data_source(self, iterable: Optional[cst.BaseExpression], at: _Located, depth: int) -> bool:
        """Whether a ``for`` loop's iterable yields graph-free items (a data
        loader, ``range``, ``enumerate``/``zip`` of such, a factory tensor)."""
        if iterable is None or depth > 6:
            return False
        if isinstance(iterable, cst.Call):
            func = iterable.func
            text = dotted_name(func) or ""
            qn = self.model.qualname(func) or text
            if text == "range" or qn == "range":
                return True
            if text in _ITER_WRAPPERS or qn in _ITER_WRAPPERS:
                args = [a.value for a in iterable.args if a.keyword is None]
                if text in ("zip",):
                    return bool(args) and all(self._data_source(a, at, depth + 1) for a in args)
                return bool(args) and self._data_source(args[0], at, depth + 1)
            if isinstance(func, cst.Attribute) and func.attr.value in ("split", "chunk", "unbind", "items",
                                                                       "values", "keys"):
                return self._data_source(func.value, at, depth + 1)
            return self._value_graph_free(iterable, at, depth + 1)
        if isinstance(iterable, cst.Subscript):
            return self._data_source(iterable.value, at, depth + 1)
        if isinstance(iterable, (cst.Name, cst.Attribute)):
            text = dotted_name(iterable) or ""
            last = text.rsplit(".", 1)[-1]
            binding = self.reaching(text, at)
            if binding is None or binding.kind == "param":
                return bool(_DATA_SOURCE.search(last))
            if binding.kind == "for":
                return self._data_source(binding.value, binding, depth + 1)
            if binding.kind in ("assign", "annassign") and self._data_source(binding.value, binding, depth + 1):
                return True
            return self._binding_graph_free(binding, depth + 1)
        return self._value_graph_free(iterable, at, depth + 1)

    # -- reads of an expression ------------------------------------------------------
    def _reads(self, expr: Optional[cst.BaseExpression], scope: Scope) -> _Reads:
        out = _Reads()
        if expr is not None:
            comp_names: set[str] = set()
            self._collect(expr, scope, out, comp_names)
            out.names -= comp_names
        return out

    def _collect(self, node: cst.CSTNode, scope: Scope, out: _Reads, comp: set[str]) -> None:
        model = self.model
        if isinstance(node, (cst.Name, cst.Attribute)):
            text = dotted_name(node)
            if text is None:  # attribute of a call/subscript: a tensor method chain
                assert isinstance(node, cst.Attribute)
                if node.attr.value == "data":
                    return
                self._collect(node.value, scope, out, comp)
                return
            if text in ("None", "True", "False"):
                return
            if isinstance(node, cst.Attribute) and node.attr.value == "data":
                return
            if isinstance(node, cst.Attribute) and not model.bindings_of(text, scope):
                head = text.split(".")[0]
                # ``self.encoder`` / ``torch.pi``: an object or a constant.
                if head in ("self", "cls") or model.names.aliases.get(head) is not None:
                    return
                text = head
            out.names.add(text)
            return
        if isinstance(node, cst.Call):
            self._collect_call(node, scope, out, comp)
            return
        if isinstance(node, (cst.BinaryOperation, cst.UnaryOperation)):
            out.forward = True
        elif isinstance(node, (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)):
            for f in _comp_fors(node):
                comp.update(n.value for n in _names(f.target))
        elif isinstance(node, cst.Lambda):
            return
        for child in iter_children(node):
            self._collect(child, scope, out, comp)

    def _collect_call(self, node: cst.Call, scope: Scope, out: _Reads, comp: set[str]) -> None:
        model = self.model
        func = node.func
        qn = model.qualname(func) or ""
        if _TORCH_FACTORIES.match(qn):
            return  # a fresh leaf: nothing flows in, no graph
        if isinstance(func, cst.Name):
            if func.value in _DETACH_FUNCS or self._is_detach_helper(node):
                return
            out.forward = True
        elif isinstance(func, cst.Attribute):
            method = func.attr.value
            if method in _DETACH_METHODS:
                return
            text = dotted_name(func)
            head = text.split(".")[0] if text else None
            if head is not None and (head in ("self", "cls") or model.names.aliases.get(head) is not None):
                if self._is_detach_helper(node):
                    return
                out.forward = True
            else:
                out.forward = True
                receiver = func.value
                rtext = dotted_name(receiver)
                if rtext is None or not _OBJECT_PARAM.search(rtext.rsplit(".", 1)[-1]):
                    self._collect(receiver, scope, out, comp)
                # else ``model.encoder(x)``: a module named like one, not a tensor
        else:
            out.forward = True
            self._collect(func, scope, out, comp)
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value in _META_KEYWORDS:
                continue
            self._collect(arg.value, scope, out, comp)

    def _is_detach_helper(self, node: cst.Call) -> bool:
        """A same-file helper that detaches (``repackage_hidden(h)``)."""
        call = self._calls.get(id(node))
        if call is None:
            return False
        for fn in self.model.resolve_callee(call):
            key = id(fn)
            if key not in self._detach_helpers:
                self._detach_helpers[key] = any(
                    c.method in ("detach", "detach_") for c in self.model.calls_within(fn.order, fn.end)
                )
            if self._detach_helpers[key]:
                return True
        return False


def _join(kinds: list[Optional[str]]) -> Optional[str]:
    """Kind of a container of values of ``kinds``."""
    if any(k is None for k in kinds):
        return None
    if OBJECT in kinds:
        return OBJECT
    return LEAF if LEAF in kinds else DATA


def _comp_fors(node: cst.CSTNode) -> list[cst.CompFor]:
    out = []
    f: Union[cst.CompFor, None] = getattr(node, "for_in", None)
    while f is not None:
        out.append(f)
        f = f.inner_for_in
    return out


def _names(node: cst.CSTNode) -> list[cst.Name]:
    if isinstance(node, cst.Name):
        return [node]
    out: list[cst.Name] = []
    for child in iter_children(node):
        out += _names(child)
    return out


def backward_follows_in_iteration(model: FileModel, call: Call) -> bool:
    """Whether another backward (``.backward()``, ``torch.autograd.grad``...,
    directly or through a same-file helper, up to 3 calls deep) may run after
    ``call`` before the iteration of any enclosing loop ends: lexically after
    it inside one of its enclosing loops of the same scope."""
    for loop in call.loops:
        for other in model.calls_within(call.order + 1, loop.end):
            if other.scope is call.scope and other.node is not call.node and runs_backward(model, other, accumulating_only=False):
                return True
    return False
