"""Facts about ``torch.nn.Module`` subclasses defined in a file: which classes
they are, which method a node sits in, and which methods ``forward`` reaches.

PyTorch docs: ``torch.nn.Module`` ("Base class for all neural network
modules ... Submodules assigned in this way will be registered"),
``torch.nn.Module.training``, ``torch.nn.Module.forward``.

Used by TGL203 (functional dropout in a module method), TGL006 (unregistered
submodules) and TGL007 (layers built in ``forward``).
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .literals import is_literal
from .model import ClassInfo, FileModel, Scope, names_in, nodes_under_if, unwrap  # noqa: F401 (re-exported)
from .modes import module_classes
from .names import dotted_name
from .tree import walk

# Frameworks with an ``nn`` namespace of their own: a class deriving from one of
# these is not a torch module, whatever ``nn.Module`` spells.
FOREIGN_NN = ("mlx.", "flax.", "haiku.", "jax.", "equinox.", "tensorflow.", "keras.", "tf.", "paddle.",
              "mindspore.", "oneflow.", "mxnet.", "trax.", "objax.", "jittor.", "tinygrad.")

_STATIC = frozenset({"staticmethod", "classmethod"})


def _foreign(base: str) -> bool:
    return base.startswith(FOREIGN_NN) or base.split(".")[0] in {f.rstrip(".") for f in FOREIGN_NN}


def is_torch_module_class(model: FileModel, name: str, *, lenient: bool = False) -> bool:
    """Whether the same-file class ``name`` is a ``torch.nn.Module`` subclass.

    Strict: it derives (transitively, through same-file classes) from
    ``torch.nn.Module``, another ``torch.nn`` class or a Lightning module
    (:func:`.modes.module_classes`). ``lenient`` also accepts a class that
    defines ``forward`` and derives from a base the file cannot see (imported
    from elsewhere), unless a base belongs to another framework (MLX, Flax,
    Haiku, Keras, ...): what a rule that already matched a torch API inside
    the class (``torch.nn.functional.dropout``) may assume.
    """
    if name in module_classes(model):
        return True
    info = model.classes.get(name)
    if not lenient or info is None or "forward" not in info.methods:
        return False
    if not info.bases or any(_foreign(b) for b in info.bases):
        return False
    return all(b != "object" for b in info.bases)


def enclosing_method(model: FileModel, scope: Scope) -> Optional[tuple[ClassInfo, Scope]]:
    """The class and method a scope belongs to: ``scope`` itself when it is a
    method, or the method a nested function or lambda is defined in."""
    s: Optional[Scope] = scope
    while s is not None:
        if s.kind == "function" and s.class_name is not None:
            info = model.classes.get(s.class_name)
            if info is None or info.methods.get(s.name) is not s:
                return None
            return info, s
        if s.kind == "class":
            return None
        s = s.parent
    return None


def self_name(method: Scope) -> Optional[str]:
    """The name of an instance method's first parameter (``self``), or ``None``
    for a static or class method or one without parameters."""
    fn = method.node
    if isinstance(fn, cst.FunctionDef):
        for dec in fn.decorators:
            d = dec.decorator
            if isinstance(d, cst.Name) and d.value in _STATIC:
                return None
        params = [*fn.params.posonly_params, *fn.params.params]
        if params:
            return params[0].name.value
    return None


def _lazy_test(test: cst.BaseExpression, owner: str) -> bool:
    """``self.x is None``, ``not self.x``, ``not hasattr(self, ...)``, ``self.x is None or ...``:
    a test that is true only until ``owner`` has been set up."""
    if isinstance(test, cst.BooleanOperation):
        return _lazy_test(test.left, owner) or _lazy_test(test.right, owner)
    if isinstance(test, cst.Comparison):
        return any(isinstance(t.operator, cst.Is) and isinstance(t.comparator, cst.Name)
                   and t.comparator.value == "None" for t in test.comparisons) and owner in names_in(test.left)
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = test.expression
        if isinstance(inner, cst.Call) and isinstance(inner.func, cst.Name) and inner.func.value == "hasattr":
            return bool(inner.args) and owner in names_in(inner.args[0].value)
        return owner in names_in(inner)
    return False


def lazy_guarded(model: FileModel, method: Scope) -> set[int]:
    """ids of the nodes of ``method`` inside an ``if`` whose test holds only until
    the instance is set up (``if self.fc is None:``, ``if not self._built:``): lazy
    initialisation, which runs once."""
    owner = self_name(method)
    if not owner:
        return set()
    return nodes_under_if(model, method.node, "lazy", lambda t: _lazy_test(t, owner))


def forward_methods(model: FileModel, info: ClassInfo) -> list[Scope]:
    """``forward`` of class ``info`` and every same-class method it calls as
    ``self.m(...)``, transitively (helpers such as ``_project`` that run on every
    call). A call under a lazy-initialisation guard (:func:`lazy_guarded`) runs
    once and is not followed. Empty when the class defines no ``forward``."""
    start = info.methods.get("forward")
    if start is None:
        return []
    seen: dict[int, Scope] = {id(start): start}
    todo = [start]
    while todo:
        scope = todo.pop()
        name = self_name(scope)
        if not name:
            continue
        guarded = lazy_guarded(model, scope)
        for c in model.calls_within(scope.order, scope.end):
            if not c.func_text or not c.func_text.startswith(name + ".") or id(c.node) in guarded:
                continue
            target = info.methods.get(c.func_text[len(name) + 1:])
            if target is not None and id(target) not in seen:
                seen[id(target)] = target
                todo.append(target)
    return list(seen.values())


# -- torch.nn layer kinds -------------------------------------------------------------------
# Layers with parameters (``torch.nn`` names, without the prefix). Norm layers with
# ``affine``/``elementwise_affine`` are parameterised unless that argument is a literal False.
_PARAMETERISED = re.compile(
    r"^(?:Linear|Bilinear|Conv(?:Transpose)?[123]d|BatchNorm[123]d|SyncBatchNorm|InstanceNorm[123]d|LayerNorm|"
    r"GroupNorm|RMSNorm|Embedding|EmbeddingBag|RNN|LSTM|GRU|RNNCell|LSTMCell|GRUCell|"
    r"MultiheadAttention|Transformer|TransformerEncoder|TransformerDecoder|TransformerEncoderLayer|"
    r"TransformerDecoderLayer|PReLU)$")
_AFFINE_KW = {"LayerNorm": "elementwise_affine", "RMSNorm": "elementwise_affine", "GroupNorm": "affine",
              "BatchNorm1d": "affine", "BatchNorm2d": "affine", "BatchNorm3d": "affine", "SyncBatchNorm": "affine"}
# Instance norm has no parameters by default (affine=False).
_DEFAULT_OFF = {"InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"}
# Layers with neither parameters, buffers nor train/eval behaviour: keeping them in a
# plain list changes nothing.
_STATELESS = re.compile(
    r"^(?:Identity|Flatten|Unflatten|ReLU6?|LeakyReLU|ELU|SELU|CELU|GELU|SiLU|Mish|Sigmoid|Tanh|Hardtanh|"
    r"Hardswish|Hardsigmoid|Softplus|Softsign|Softshrink|Hardshrink|Tanhshrink|Threshold|LogSigmoid|GLU|"
    r"Softmax|Softmax2d|LogSoftmax|Softmin|(?:Max|Avg|LP|AdaptiveMax|AdaptiveAvg|FractionalMax)Pool[123]d|"
    r"MaxUnpool[123]d|Upsample|UpsamplingNearest2d|UpsamplingBilinear2d|PixelShuffle|PixelUnshuffle|"
    r"ChannelShuffle|(?:Zero|Constant|Reflection|Replication|Circular)Pad[123]d|CosineSimilarity|"
    r"PairwiseDistance|Fold|Unfold)$")




def nn_layer_name(model: FileModel, node: Optional[cst.BaseExpression]) -> Optional[str]:
    """``"Linear"`` for a call of ``torch.nn.Linear`` (however imported), else ``None``."""
    if not isinstance(node, cst.Call):
        return None
    qn = model.qualname(node.func) or ""
    if not qn.startswith("torch.nn.") or qn.count(".") != 2:
        return None
    last = qn.rsplit(".", 1)[-1]
    return last if last[:1].isupper() else None


def is_parameterised_layer(model: FileModel, node: Optional[cst.BaseExpression]) -> bool:
    """Whether ``node`` constructs a ``torch.nn`` layer that owns parameters
    (Linear, Conv*, BatchNorm*, LayerNorm/GroupNorm with affine, Embedding*,
    RNN/LSTM/GRU*, MultiheadAttention, Transformer*, ...)."""
    name = nn_layer_name(model, node)
    if name is None or not _PARAMETERISED.match(name):
        return False
    assert isinstance(node, cst.Call)
    for a in node.args:
        if a.keyword is not None and a.keyword.value in ("affine", "elementwise_affine"):
            return not is_literal(a.value, False)
    return name not in _DEFAULT_OFF


def is_stateful_module_ctor(model: FileModel, node: Optional[cst.BaseExpression]) -> bool:
    """Whether ``node`` constructs a module whose registration matters: a
    ``torch.nn`` layer that is not stateless (it has parameters, buffers or
    train/eval behaviour, e.g. Dropout), a loss with a ``weight``, or an
    instance of a same-file torch module class."""
    name = nn_layer_name(model, node)
    if name is not None:
        if name in ("Parameter", "ParameterList", "ParameterDict", "Buffer"):
            return False
        if name.endswith("Loss"):
            assert isinstance(node, cst.Call)
            return any(a.keyword is not None and a.keyword.value in ("weight", "pos_weight") for a in node.args)
        return not _STATELESS.match(name)
    if isinstance(node, cst.Call):
        qn = model.qualname(node.func) or ""
        return "." not in qn and is_torch_module_class(model, qn) and not stateless_module_class(model, qn)
    return False


_MODULE_ROOTS = frozenset({"torch.nn.Module", "torch.nn.modules.module.Module"})
_STATE_CALLS = frozenset({"register_parameter", "register_buffer", "add_module", "register_module", "setattr",
                          "__setattr__", "load_state_dict"})


def stateless_module_class(model: FileModel, name: str, seen: Optional[frozenset[str]] = None) -> bool:
    """Whether instances of the same-file module class ``name`` hold neither
    parameters nor buffers and behave alike in training and eval mode, so
    that keeping them in a plain list changes nothing (``class
    moving_avg(nn.Module)`` holding an ``nn.AvgPool1d``): it derives from
    ``nn.Module`` directly or through such classes; every module it builds is
    a stateless ``torch.nn`` layer (:data:`_STATELESS`) or an instance of
    such a class; it creates no ``nn.Parameter`` and no tensor, registers
    nothing by name, never reads ``self.training``, and every value stored on
    ``self`` from elsewhere (a parameter of ``__init__``) is neither called
    nor has an attribute read (``self.kernel_size = kernel_size``, used in
    arithmetic, is a number; ``self.block = block`` or ``self.block =
    make_block()`` called in ``forward`` may be a module with parameters).
    Plain tensors stored on ``self`` are no state a registration would
    change."""
    seen = seen or frozenset()
    info = model.classes.get(name)
    if info is None or name in seen or not info.bases:
        return False
    seen = seen | {name}
    for base in info.bases:
        if base not in _MODULE_ROOTS and not ("." not in base and base in model.classes
                                              and stateless_module_class(model, base, seen)):
            return False
    stored: set[str] = set()  # attributes holding a value the class did not build
    for node in walk(info.node):
        if isinstance(node, cst.Attribute) and node.attr.value == "training" and dotted_name(node.value) == "self":
            return False
        if isinstance(node, cst.Call):
            qn = model.qualname(node.func) or ""
            last = qn.rsplit(".", 1)[-1] if qn else (node.func.attr.value if isinstance(node.func, cst.Attribute)
                                                      else "")
            if last in _STATE_CALLS or nn_layer_name(model, node) in ("Parameter", "ParameterList", "ParameterDict",
                                                                      "Buffer"):
                return False
            if nn_layer_name(model, node) is not None and is_stateful_module_ctor(model, node):
                return False
            if "." not in qn and qn in model.classes and not stateless_module_class(model, qn, seen):
                return False
    for method in info.methods.values():
        for a in model.assigns_in_scope(method):
            for t in a.targets:
                value = unwrap(a.value) if a.value is not None else None
                built = isinstance(value, cst.Call) and (nn_layer_name(model, value) is not None or (
                    model.qualname(value.func) or "") in model.classes)
                if t.kind == "attr" and t.text and t.text.startswith("self.") and t.text.count(".") == 1 and not built:
                    stored.add(t.text)
    if not stored:
        return True
    for node in walk(info.node):  # ``self.block(x)``, ``self.block.weight``: maybe a module from outside
        if isinstance(node, cst.Call) and dotted_name(node.func) in stored:
            return False
        if isinstance(node, cst.Attribute) and dotted_name(node.value) in stored:
            return False
    return True


def is_requires_grad_tensor(model: FileModel, node: Optional[cst.BaseExpression]) -> bool:
    """Whether ``node`` makes a plain tensor that requires grad:
    ``torch.<factory>(..., requires_grad=True)``,
    ``torch.autograd.Variable(..., requires_grad=True)``, or
    ``torch.<factory>(...).requires_grad_()``."""
    if not isinstance(node, cst.Call):
        return False
    func = node.func
    if isinstance(func, cst.Attribute) and func.attr.value == "requires_grad_":
        flag = node.args[0].value if node.args else None
        return (flag is None or is_literal(flag, True)) and is_torch_factory(model, func.value)
    if not is_torch_factory(model, node):
        return False
    return any(a.keyword is not None and a.keyword.value == "requires_grad" and is_literal(a.value, True)
               for a in node.args)


def is_torch_factory(model: FileModel, node: Optional[cst.BaseExpression]) -> bool:
    """A call of a ``torch.*`` function (not ``torch.nn.*``) or of ``torch.autograd.Variable``."""
    if not isinstance(node, cst.Call):
        return False
    qn = model.qualname(node.func) or ""
    if qn == "torch.autograd.Variable":
        return True
    return qn.startswith("torch.") and qn.count(".") == 1 and qn[6:7].islower()
