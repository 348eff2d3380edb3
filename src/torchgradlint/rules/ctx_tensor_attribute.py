"""TGL104 ctx-tensor-attribute."""

from __future__ import annotations

from typing import Iterator, Optional

import libcst as cst

from ..analysis.model import Assign, FileModel, Scope, _Located
from ..analysis.names import dotted_name
from ..analysis.tree import walk
from ..analysis.type_guards import not_a_tensor_at
from ..registry import Finding, Rule

#: qualified names of ``torch.autograd.Function`` (and its in-place variant)
FUNCTION_BASES = frozenset({
    "torch.autograd.Function", "torch.autograd.function.Function", "torch.autograd.function.InplaceFunction",
})
# Attributes and methods of a tensor that give something other than a tensor.
_NON_TENSOR_ATTRS = frozenset({
    "shape", "size", "dim", "ndim", "ndimension", "numel", "dtype", "device", "is_cuda", "requires_grad",
    "stride", "item", "tolist", "data_ptr", "storage_offset", "element_size", "nelement", "is_contiguous",
    "get_device", "layout", "names", "is_sparse", "is_floating_point", "is_complex", "numpy", "__len__",
})
# Attributes read on a name that show it is a tensor (a parameter used as a tensor in ``forward``).
_TENSOR_EVIDENCE = _NON_TENSOR_ATTRS - {"item", "tolist", "numpy", "__len__"} | frozenset({
    "view", "view_as", "reshape", "contiguous", "clone", "detach", "new_zeros", "new_ones", "new_empty",
    "new_full", "new_tensor", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand", "expand_as",
    "masked_fill", "masked_fill_", "float", "double", "half", "to", "type_as", "flatten", "mm", "matmul", "bmm",
    "sum", "mean", "exp", "sigmoid", "tanh", "abs", "sign", "clamp", "pow", "sqrt", "norm", "narrow", "select",
    "index_select", "gather", "scatter", "scatter_", "unfold", "chunk", "split", "data", "grad", "T", "mT",
})
# Methods of a tensor whose result is a tensor derived from it (``new_*`` make fresh buffers).
_TENSOR_METHODS = _TENSOR_EVIDENCE - _NON_TENSOR_ATTRS - {"data", "grad", "chunk", "split", "new_zeros", "new_ones",
                                                          "new_empty", "new_full", "new_tensor"}
_SCALAR_ANNOTATIONS = frozenset({"int", "float", "bool", "str", "bytes", "complex", "tuple", "list", "dict", "None",
                                 "Optional", "Sequence", "Tuple", "List", "Dict", "Callable", "torch.Size",
                                 "torch.dtype", "torch.device"})
_MAX_DEPTH = 6
# torch namespaces whose lower-case functions return tensors, and the exceptions.
_TENSOR_NAMESPACES = frozenset({"torch", "torch.nn.functional", "torch.linalg", "torch.fft", "torch.special"})
_NON_TENSOR_FUNCTIONS = frozenset({
    "is_tensor", "is_storage", "numel", "is_grad_enabled", "get_default_dtype", "manual_seed", "seed",
    "initial_seed", "set_grad_enabled", "no_grad", "enable_grad", "inference_mode", "is_floating_point",
    "is_complex", "is_nonzero", "result_type", "promote_types", "can_cast", "finfo", "iinfo", "device",
    "broadcast_shapes", "get_rng_state", "is_autocast_enabled", "get_autocast_gpu_dtype", "typename",
})
# Factories: their first argument is a size or data, not evidence that a parameter is a tensor.
_FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "arange", "linspace", "logspace", "eye",
    "tensor", "as_tensor", "from_numpy", "Tensor", "LongTensor", "FloatTensor", "randperm", "scalar_tensor",
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
})


def torch_tensor_function(qn: Optional[str]) -> bool:
    """Whether ``qn`` is a torch function returning a tensor (``torch.exp``, ``torch.nn.functional.relu``)."""
    if not qn or "." not in qn:
        return False
    namespace, _, name = qn.rpartition(".")
    return namespace in _TENSOR_NAMESPACES and name[:1].islower() and name not in _NON_TENSOR_FUNCTIONS \
        and not name.startswith(("is_", "get_", "set_"))


def function_classes(model: FileModel) -> list[str]:
    """Same-file subclasses (transitively) of ``torch.autograd.Function``, in source order."""
    found: list[str] = []
    changed = True
    while changed:
        changed = False
        for name, info in model.classes.items():
            if name not in found and any(b in FUNCTION_BASES or b.split(".")[-1] in found for b in info.bases):
                found.append(name)
                changed = True
    return found


def _param_nodes(scope: Scope) -> list[cst.Param]:
    fn = scope.node
    if not isinstance(fn, cst.FunctionDef):
        return []
    p = fn.params
    return [*p.posonly_params, *p.params, *p.kwonly_params]


class _Forward:
    """Tensor facts of one ``forward``/``setup_context`` body: which of its parameters are tensors."""

    def __init__(self, model: FileModel, scope: Scope, ctx: str) -> None:
        self.model = model
        self.scope = scope
        self.tensor_params = self._tensor_params(ctx)

    def _tensor_params(self, ctx: str) -> set[str]:
        model, scope = self.model, self.scope
        params = _param_nodes(scope)
        scalar: set[str] = set()
        tensors: set[str] = set()
        for p in params:
            name = p.name.value
            ann = dotted_name(p.annotation.annotation) if p.annotation is not None else None
            if ann is not None and (model.qualname(ann) or ann).split(".")[-1] == "Tensor":
                tensors.add(name)
            elif p.annotation is not None or p.default is not None:
                scalar.add(name)  # annotated as something else, or a default (a flag, a size, p=0.5)
        if scope.name == "setup_context" and len(params) >= 3:
            tensors.add(params[2].name.value)  # ``output``
        body = scope.node
        for node in walk(body):
            if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) \
                    and node.attr.value in _TENSOR_EVIDENCE:
                tensors.add(node.value.value)
            elif isinstance(node, cst.Call):
                qn = model.qualname(node.func) or ""
                positional = [a.value for a in node.args if a.keyword is None and not a.star]
                if dotted_name(node.func) in (f"{ctx}.save_for_backward", f"{ctx}.mark_dirty",
                                              f"{ctx}.mark_non_differentiable"):
                    tensors.update(a.value for a in positional if isinstance(a, cst.Name))
                elif positional and isinstance(positional[0], cst.Name) and torch_tensor_function(qn) \
                        and qn.rsplit(".", 1)[-1] not in _FACTORIES:
                    tensors.add(positional[0].value)
        return (tensors - scalar - {ctx}) & {p.name.value for p in params}

    def is_tensor(self, node: Optional[cst.BaseExpression], at: _Located, depth: int = 0) -> bool:
        """Whether ``node`` evaluated at ``at`` is (or holds) a tensor, on evidence; unknown is ``False``."""
        if node is None or depth > _MAX_DEPTH:
            return False
        if isinstance(node, (cst.Tuple, cst.List)):
            return any(self.is_tensor(e.value, at, depth + 1) for e in node.elements)
        if isinstance(node, cst.Name):
            if not_a_tensor_at(self.model, node.value, at):
                return False  # ``else`` of ``if torch.is_tensor(x):``, ``if isinstance(x, float):``
            if node.value in self.tensor_params:
                binding = self.model.reaching_binding(node.value, at)
                return binding is None or binding.kind == "param" or self._bound_tensor(binding, depth)
            binding = self.model.reaching_binding(node.value, at)
            return binding is not None and self._bound_tensor(binding, depth)
        if isinstance(node, cst.Attribute):
            return False if node.attr.value in _NON_TENSOR_ATTRS else node.attr.value in ("data", "T", "mT") \
                and self.is_tensor(node.value, at, depth + 1)
        if isinstance(node, cst.Subscript):
            return self.is_tensor(node.value, at, depth + 1)
        if isinstance(node, cst.BinaryOperation):
            return self.is_tensor(node.left, at, depth + 1) or self.is_tensor(node.right, at, depth + 1)
        if isinstance(node, cst.UnaryOperation):
            return not isinstance(node.operator, cst.Not) and self.is_tensor(node.expression, at, depth + 1)
        if isinstance(node, cst.Comparison):
            return self.is_tensor(node.left, at, depth + 1)
        if isinstance(node, cst.Call):
            func = node.func
            qn = self.model.qualname(func)
            if torch_tensor_function(qn):
                # a fresh buffer or constant (torch.zeros(n), torch.tensor(alpha)) is not derived from the inputs
                return qn.rsplit(".", 1)[-1] not in _FACTORIES
            if isinstance(func, cst.Attribute) and not (qn or "").startswith("torch."):
                return func.attr.value in _TENSOR_METHODS and self.is_tensor(func.value, at, depth + 1)
            return False
        return False

    def _bound_tensor(self, binding: Assign, depth: int) -> bool:
        if binding.kind not in ("assign", "annassign", "walrus") or binding.unpacked or binding.op is not None:
            return False
        return self.is_tensor(binding.value, binding, depth + 1)


def _returned(scope: Scope) -> set[str]:
    """Names returned as such (``return out`` / ``return out, idx``) by ``forward``."""
    out = set()
    for node in walk(scope.node):
        if isinstance(node, cst.Return) and node.value is not None:
            values = [e.value for e in node.value.elements] if isinstance(node.value, cst.Tuple) else [node.value]
            out.update(v.value for v in values if isinstance(v, cst.Name))
    return out


def _message(attr: str, text: str, role: str) -> str:
    fix = "use `ctx.save_for_backward(...)` in forward and `ctx.saved_tensors` in backward"
    if role == "output":
        return (f"`{attr}` keeps the output `{text}` on ctx: the output and its `grad_fn` (this ctx) form a "
                "reference cycle, so dead outputs stay in memory until the cyclic garbage collector runs, and an "
                f"in-place change before backward gives a silently wrong gradient; {fix}")
    if role == "input":
        return (f"`{attr}` keeps the input `{text}` on ctx: an in-place change to it before backward gives a "
                "silently wrong gradient where `save_for_backward` would raise, and it lives as long as the "
                f"graph; {fix}")
    shown = f"`{text}`" if len(text) <= 30 else "a tensor"
    return (f"`{attr}` keeps {shown}, a tensor computed in forward, on ctx: it bypasses the version-counter "
            f"check and saved-tensor hooks and lives as long as the graph; {fix}")


def _reads(backward: Scope, ctx: str) -> set[str]:
    """Attribute names read as ``ctx.<name>`` in ``backward``."""
    out = set()
    for node in walk(backward.node):
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == ctx:
            out.add(node.attr.value)
    return out


class CtxTensorAttribute(Rule):
    """A custom ``torch.autograd.Function`` stores a tensor as a ``ctx`` attribute instead of
    ``ctx.save_for_backward``.

    Rests on: ``torch.autograd.function.FunctionCtx.save_for_backward`` ("save_for_backward should
    be called at most once, only from inside the forward() method, and only with tensors ... as
    opposed to directly on ctx ... to prevent incorrect gradients and memory leaks") and "Extending
    torch.autograd" in the notes.
    """

    code = "TGL104"
    name = "ctx-tensor-attribute"
    summary = "custom autograd.Function stores a tensor on ctx instead of save_for_backward"
    probe = "ctx-tensors"
    prefilter = (("Function",), ("ctx", "backward"))
    docs = """
## What it does
Checks the `forward` (or `setup_context`) of subclasses of
`torch.autograd.Function` for `ctx.<name> = <tensor>` where the tensor is an
input of `forward`, its output, or a tensor computed from them (a torch op,
arithmetic, a view), and `ctx.<name>` is read in `backward`. A parameter of
`forward` counts as a tensor when the body uses it as one (`x.shape`,
`x.view(...)`, `torch.op(x, ...)`, `ctx.save_for_backward(x)`) or it is
annotated `Tensor`. Non-tensors stay silent: `ctx.dim = dim`, sizes and
shapes (`x.shape`, `x.size(0)`), dtypes and devices, flags, numbers,
parameters with no tensor evidence (`ctx.alpha = alpha` of a gradient
reversal layer), and `ctx.mark_dirty` / `ctx.mark_non_differentiable` /
`ctx.save_for_backward` themselves.

## Why is this bad?
Tensors meant for `backward` must go through `ctx.save_for_backward`. Stored
directly on `ctx`:

- an **output** forms a reference cycle (output -> `grad_fn` = ctx -> output):
  it is freed only by the cyclic garbage collector, so dead outputs pile up
  (measured: up to 129 x 1 MiB outputs alive at once with gc enabled, all of
  them with gc disabled; 0 with `save_for_backward`);
- an **input** (or output) modified in place before `backward` gives a
  **silently wrong gradient**; `save_for_backward` checks the tensor's version
  counter and raises "one of the variables needed for gradient computation has
  been modified by an inplace operation" instead (measured: an error of 30.4
  in the gradient, no warning).

## Example
```python
import torch


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.exp()
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.out
```

## Use instead
```python
import torch


class Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.exp()
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out
```

## References
- [FunctionCtx.save_for_backward](https://pytorch.org/docs/stable/generated/torch.autograd.function.FunctionCtx.save_for_backward.html)
- [Extending torch.autograd](https://pytorch.org/docs/stable/notes/extending.html#extending-torch-autograd)
- [torch.autograd.Function](https://pytorch.org/docs/stable/autograd.html#function)
"""

    def check(self, model: FileModel) -> Iterator[Finding]:
        for cls in function_classes(model):
            info = model.classes[cls]
            backward = model._method(cls, "backward", set())
            if backward is None or not backward.params:
                continue
            reads = _reads(backward, backward.params[0])
            if not reads:
                continue
            for method in ("forward", "setup_context"):
                scope = info.methods.get(method)
                if scope is None or not scope.params:
                    continue
                yield from self._check_method(model, scope, reads)

    @staticmethod
    def _check_method(model: FileModel, scope: Scope, reads: set[str]) -> Iterator[Finding]:
        ctx = scope.params[0]
        facts: Optional[_Forward] = None
        outputs = _returned(scope) if scope.name == "forward" else set(scope.params[2:3])
        for a in model.assigns_in_scope(scope):
            if a.kind not in ("assign", "annassign") or a.value is None:
                continue
            for t in a.targets:
                if t.kind != "attr" or not t.text or t.text.count(".") != 1:
                    continue
                head, attr = t.text.split(".")
                if head != ctx or attr not in reads:
                    continue
                if facts is None:
                    facts = _Forward(model, scope, ctx)
                value = a.value
                if a.unpacked:
                    continue
                if facts.is_tensor(value, a):
                    name = value.value if isinstance(value, cst.Name) else None
                    role = "output" if name in outputs else "input" if name in facts.tensor_params else "derived"
                    yield Finding(a.node, _message(t.text, model.module.code_for_node(value), role))
