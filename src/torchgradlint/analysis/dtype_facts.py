"""Dtype facts: which floating-point precision a tensor expression has.

Static, conservative: an answer is given only where the expression shows it
(a factory call with or without ``dtype=``, a cast such as ``.double()`` /
``.to(torch.float64)``, arithmetic of known tensors, a local binding of one);
everything else is :data:`UNKNOWN` and rules stay silent.

PyTorch docs: "Tensor Attributes" (``torch.dtype``; the default floating dtype
is ``torch.float32`` unless ``torch.set_default_dtype`` changes it) and "Type
promotion" (an operation on a ``float32`` and a ``float64`` tensor gives
``float64``; a Python scalar does not change a tensor's dtype),
https://pytorch.org/docs/stable/tensor_attributes.html.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .literals import literal_value
from .model import FileModel, _Located, argument_for
from .names import dotted_name

#: kinds of a tensor expression's dtype
DOUBLE = "double"  # float64
COMPLEX = "complex"
SINGLE = "single"  # float32, or a lower precision (float16, bfloat16)
INTEGER = "integer"  # integer or bool tensors: not differentiable
NOT_TENSOR = "not-tensor"  # a Python number or string
UNKNOWN = "unknown"

_DTYPES = {
    "float64": DOUBLE, "double": DOUBLE,
    "float32": SINGLE, "float": SINGLE, "float16": SINGLE, "half": SINGLE, "bfloat16": SINGLE,
    "complex64": COMPLEX, "complex128": COMPLEX, "cfloat": COMPLEX, "cdouble": COMPLEX, "complex32": COMPLEX,
    "chalf": COMPLEX,
    "int8": INTEGER, "int16": INTEGER, "int32": INTEGER, "int64": INTEGER, "uint8": INTEGER, "long": INTEGER,
    "int": INTEGER, "short": INTEGER, "bool": INTEGER,
}
_TENSOR_TYPES = {"DoubleTensor": DOUBLE, "FloatTensor": SINGLE, "HalfTensor": SINGLE, "BFloat16Tensor": SINGLE,
                 "LongTensor": INTEGER, "IntTensor": INTEGER, "ByteTensor": INTEGER, "BoolTensor": INTEGER}
#: half-precision dtypes (``float16``): :func:`is_float16`
_FLOAT16 = frozenset({"torch.float16", "torch.half"})

# Factories whose result has the default floating dtype when no ``dtype=`` is given.
_FLOAT_FACTORIES = frozenset({"randn", "rand", "ones", "zeros", "empty", "full", "linspace", "logspace", "eye",
                              "normal", "empty_strided"})
_INT_FACTORIES = frozenset({"randint", "randperm", "bernoulli_int"})
_LIKE_FACTORIES = frozenset({"randn_like", "rand_like", "ones_like", "zeros_like", "empty_like", "full_like",
                             "clone"})
# Methods that cast to a fixed dtype.
_CAST_METHODS = {"double": DOUBLE, "float": SINGLE, "half": SINGLE, "bfloat16": SINGLE, "cdouble": COMPLEX,
                 "cfloat": COMPLEX, "long": INTEGER, "int": INTEGER, "bool": INTEGER, "byte": INTEGER}
# Methods that keep the receiver's dtype.
_SAME_DTYPE_METHODS = frozenset({
    "cuda", "cpu", "requires_grad_", "clone", "detach", "contiguous", "view", "reshape", "t", "permute",
    "transpose", "unsqueeze", "squeeze", "expand", "repeat", "flatten", "zero_", "normal_", "uniform_", "fill_",
    "abs", "exp", "log", "sin", "cos", "tanh", "sigmoid", "relu", "sqrt", "pow", "mul", "add", "sub", "div",
    "clamp", "clamp_", "neg", "sum", "mean", "softmax", "abs_", "mul_", "add_", "div_", "sub_", "exp_",
    "pin_memory", "share_memory_", "narrow", "__getitem__",
})
_MAX_DEPTH = 8


def dtype_kind(model: FileModel, node: Optional[cst.BaseExpression], at: Optional[_Located] = None,
               _depth: int = 0) -> Optional[str]:
    """Kind of a dtype expression: ``torch.float64`` -> :data:`DOUBLE`; ``None`` if not a known dtype.

    ``torch.DoubleTensor`` and the strings ``"torch.DoubleTensor"`` (as taken by
    ``Tensor.type``) count too; with ``at``, a local name bound to one
    (``dtype = torch.float64``) is followed.
    """
    if at is not None and isinstance(node, cst.Name) and _depth < 3:
        binding = model.reaching_binding(node.value, at)
        if binding is not None and binding.kind == "assign" and not binding.unpacked and binding.value is not None:
            return dtype_kind(model, binding.value, binding, _depth + 1)
    if isinstance(node, cst.SimpleString):
        text = literal_value(node)
        text = text if isinstance(text, str) else ""
        return _TENSOR_TYPES.get(text.rsplit(".", 1)[-1]) if text.startswith("torch.") else None
    qn = model.qualname(node)
    if not qn or not qn.startswith("torch."):
        return None
    last = qn.rsplit(".", 1)[-1]
    if qn.count(".") == 1 and last in _DTYPES:
        return _DTYPES[last]
    return _TENSOR_TYPES.get(last)


def is_float16(model: FileModel, node: Optional[cst.BaseExpression], at: Optional[_Located] = None) -> bool:
    """Whether ``node`` names ``torch.float16`` / ``torch.half`` (not bfloat16); with ``at``, a local
    name bound to one (``dtype = torch.float16``) counts."""
    if at is not None and isinstance(node, cst.Name):
        binding = model.reaching_binding(node.value, at)
        if binding is not None and binding.kind == "assign" and not binding.unpacked:
            node = binding.value
    return model.qualname(node) in _FLOAT16


def sets_default_double(model: FileModel) -> bool:
    """Whether the file calls ``torch.set_default_dtype(torch.float64)`` (or
    ``set_default_tensor_type(torch.DoubleTensor)``) anywhere: then factories
    without ``dtype=`` may make double tensors."""
    def compute() -> bool:
        for call in model.calls:
            if call.qualname in ("torch.set_default_dtype", "torch.set_default_tensor_type"):
                if dtype_kind(model, call.arg(0, "d") or call.arg(0, "t")) in (DOUBLE, COMPLEX, None):
                    return True
        return False
    return bool(model.cached(("dtype_facts.default_double",), lambda: [compute()])[0])


def _combine(kinds: list[str]) -> str:
    """Type promotion over the kinds of an operation's operands."""
    tensors = [k for k in kinds if k != NOT_TENSOR]
    if not tensors:
        return NOT_TENSOR
    if COMPLEX in tensors:
        return COMPLEX
    if DOUBLE in tensors:
        return DOUBLE
    if UNKNOWN in tensors:
        return UNKNOWN
    if SINGLE in tensors:
        return SINGLE
    return INTEGER


def _number_kind(node: cst.BaseExpression) -> Optional[str]:
    if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString)):
        return NOT_TENSOR
    if isinstance(node, cst.UnaryOperation):
        return _number_kind(node.expression)
    return None


def _literal_kind(node: cst.BaseExpression) -> str:
    """Kind of ``torch.tensor(<data>)`` without ``dtype=``: float if any float literal."""
    floats = ints = 0
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (cst.List, cst.Tuple)):
            stack.extend(e.value for e in n.elements)
        elif isinstance(n, cst.UnaryOperation):
            stack.append(n.expression)
        elif isinstance(n, cst.Float):
            floats += 1
        elif isinstance(n, cst.Imaginary):
            return COMPLEX
        elif isinstance(n, cst.Integer):
            ints += 1
        else:
            return UNKNOWN
    if floats:
        return SINGLE
    return INTEGER if ints else UNKNOWN


def tensor_kind(model: FileModel, node: Optional[cst.BaseExpression], at: _Located, _depth: int = 0) -> str:
    """The dtype kind of the tensor expression ``node`` evaluated at ``at``.

    Follows local names through :meth:`FileModel.reaching_binding`, and a
    function's parameter to what its same-file callers pass
    (:func:`_parameter_kind`); an unknown callee or an ambiguous binding is
    :data:`UNKNOWN`.
    A file that sets the default dtype to float64 makes dtype-less factories
    :data:`UNKNOWN`.
    """
    if node is None or _depth > _MAX_DEPTH:
        return UNKNOWN
    number = _number_kind(node)
    if number is not None:
        return number
    if isinstance(node, cst.BinaryOperation):
        return _combine([tensor_kind(model, node.left, at, _depth + 1),
                         tensor_kind(model, node.right, at, _depth + 1)])
    if isinstance(node, cst.UnaryOperation):
        return tensor_kind(model, node.expression, at, _depth + 1)
    if isinstance(node, cst.Subscript):
        return tensor_kind(model, node.value, at, _depth + 1)
    if isinstance(node, (cst.Name, cst.Attribute)):
        text = dotted_name(node)
        if text is None:
            return UNKNOWN
        binding = model.reaching_binding(text, at)
        if binding is not None and binding.kind == "param":
            return _parameter_kind(model, text, at, _depth)
        if binding is None or binding.value is None or binding.unpacked or binding.kind not in (
                "assign", "annassign", "walrus"):
            return UNKNOWN
        if binding.op is not None:
            return UNKNOWN
        return tensor_kind(model, binding.value, binding, _depth + 1)
    if isinstance(node, cst.Call):
        return _call_kind(model, node, at, _depth)
    return UNKNOWN


def _parameter_kind(model: FileModel, name: str, at: _Located, depth: int) -> str:
    """The dtype kind of the parameter ``name`` of ``at``'s function: the
    kind every same-file caller passes for it, when they all pass the same
    known kind (``numerical_gradient_check(layer, x)`` called with ``x =
    torch.randn(...)``); :data:`UNKNOWN` without callers, for a default, or
    when callers disagree."""
    fn = model.enclosing_function(at.scope)
    callers = model.callers_of(fn) if fn is not None else []
    kinds = set()
    for call in callers:
        arg = argument_for(call, fn, name)
        if arg is None:
            return UNKNOWN
        kinds.add(tensor_kind(model, arg, call, depth + 1))
    return kinds.pop() if len(kinds) == 1 else UNKNOWN


def _call_kind(model: FileModel, node: cst.Call, at: _Located, depth: int) -> str:
    args = [a for a in node.args if a.keyword is None and not a.star]
    kwargs = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
    func = node.func
    qn = model.qualname(func) or ""
    if "dtype" in kwargs:
        kind = dtype_kind(model, kwargs["dtype"], at)
        if kind is not None:
            return kind
        if qn.startswith("torch.") or isinstance(func, cst.Attribute):
            return UNKNOWN
    if qn.startswith("torch.") and qn.count(".") == 1:
        name = qn.split(".", 1)[1]
        if name in _FLOAT_FACTORIES:
            return UNKNOWN if sets_default_double(model) else SINGLE
        if name in _INT_FACTORIES:
            return INTEGER
        if name in ("tensor", "as_tensor", "Tensor", "FloatTensor", "DoubleTensor"):
            if name in ("Tensor", "FloatTensor"):
                return UNKNOWN if name == "Tensor" and sets_default_double(model) else SINGLE
            if name == "DoubleTensor":
                return DOUBLE
            if not args:
                return UNKNOWN
            kind = _literal_kind(args[0].value)
            if kind == SINGLE and sets_default_double(model):
                return UNKNOWN
            return kind if kind != UNKNOWN else tensor_kind(model, args[0].value, at, depth + 1)
        if name == "arange":
            kinds = [_literal_kind(a.value) for a in args]
            if any(k == SINGLE for k in kinds):
                return UNKNOWN if sets_default_double(model) else SINGLE
            return INTEGER if kinds and all(k == INTEGER for k in kinds) else UNKNOWN
        if name in _LIKE_FACTORIES and args:
            return tensor_kind(model, args[0].value, at, depth + 1)
        if name in ("cat", "stack", "concat") and args and isinstance(args[0].value, (cst.Tuple, cst.List)):
            return _combine([tensor_kind(model, e.value, at, depth + 1) for e in args[0].value.elements])
        if args and not name[:1].isupper():
            # an elementwise op (torch.sigmoid(x), torch.matmul(a, b)): promotion over tensor operands
            return _combine([tensor_kind(model, a.value, at, depth + 1) for a in args])
        return UNKNOWN
    if qn in ("torch.autograd.Variable", "torch.nn.Parameter", "torch.nn.parameter.Parameter") and args:
        return tensor_kind(model, args[0].value, at, depth + 1)
    if isinstance(func, cst.Attribute):
        method = func.attr.value
        receiver = func.value
        if method in _CAST_METHODS and not args:
            return _CAST_METHODS[method]
        if method in ("to", "type"):
            for a in args:
                kind = dtype_kind(model, a.value, at)
                if kind is not None:
                    return kind
            return tensor_kind(model, receiver, at, depth + 1)
        if method in _SAME_DTYPE_METHODS:
            return tensor_kind(model, receiver, at, depth + 1)
    return UNKNOWN
