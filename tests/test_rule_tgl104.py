"""TGL104 ctx-tensor-attribute on short snippets the fixtures do not cover."""

from rule_snippets import finding_lines

from torchgradlint.rules.ctx_tensor_attribute import CtxTensorAttribute


def lines(src: str) -> list[int]:
    return finding_lines(CtxTensorAttribute, src)


def fn(forward_body: str, backward_reads: str, header: str = "import torch\n",
       base: str = "torch.autograd.Function", sig: str = "ctx, x, dim, alpha") -> str:
    return header + f"""
class F({base}):
    @staticmethod
    def forward({sig}):
{forward_body}
    @staticmethod
    def backward(ctx, grad):
        return grad * {backward_reads}
"""


def test_output_input_and_derived_tensors_are_flagged():
    body = """        out = torch.exp(x)
        ctx.out = out
        ctx.x = x
        ctx.mask = x > 0
        ctx.y = x.view(-1)
        return out
"""
    assert lines(fn(body, "ctx.out * ctx.x * ctx.mask * ctx.y")) == [7, 8, 9, 10]


def test_non_tensors_are_silent():
    body = """        ctx.dim = dim
        ctx.alpha = alpha
        ctx.shape = x.shape
        ctx.n = x.size(0)
        ctx.dtype = x.dtype
        ctx.device = x.device
        ctx.flag = True
        ctx.name = "f"
        ctx.none = None
        ctx.sizes = [1, 2]
        ctx.mark_non_differentiable(x)
        return x * 2
"""
    reads = "ctx.dim * ctx.alpha * ctx.shape * ctx.n * ctx.dtype * ctx.device * ctx.flag * ctx.name * ctx.none"
    assert lines(fn(body, reads + " * ctx.sizes")) == []


def test_fresh_buffers_and_constants_are_silent():
    body = """        ctx.bufs = [x.new_empty(0), x.new_empty(0)]
        ctx.scale = torch.tensor(alpha)
        ctx.zeros = torch.zeros(3)
        return x * 2
"""
    assert lines(fn(body, "ctx.bufs * ctx.scale * ctx.zeros")) == []


def test_attribute_not_read_in_backward_is_silent():
    body = """        ctx.out = x * 2
        return ctx.out
"""
    assert lines(fn(body, "2")) == []


def test_parameter_without_tensor_evidence_is_silent_annotation_is_evidence():
    assert lines(fn("        ctx.alpha = alpha\n        return x.view_as(x)\n", "ctx.alpha")) == []
    assert lines(fn("        ctx.alpha = alpha\n        return x * 1\n", "ctx.alpha",
                    sig="ctx, x, dim, alpha: torch.Tensor")) == [6]
    assert lines(fn("        ctx.alpha = alpha\n        return x * alpha\n", "ctx.alpha",
                    sig="ctx, x, dim, alpha: float")) == []


def test_default_valued_parameter_is_not_a_tensor():
    assert lines(fn("        ctx.p = p\n        return torch.dropout(x, p, True)\n", "ctx.p",
                    sig="ctx, x, p=0.5")) == []


def test_alias_import_and_subclass_of_a_same_file_function():
    src = """import torch.autograd as AG


class Base(AG.Function):
    pass


class G(Base):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return x.exp()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.x.exp()
"""
    assert lines(src) == [11]


def test_setup_context_output_is_flagged():
    src = """from torch.autograd import Function


class G(Function):
    @staticmethod
    def forward(x):
        return x.exp()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.out = output

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.out
"""
    assert lines(src) == [11]


def test_not_a_torch_function_is_silent():
    src = """import mlx.nn as nn
from mylib import Function


class G(Function):
    @staticmethod
    def forward(ctx, x):
        ctx.x = x
        return x.exp()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.x.exp()
"""
    assert lines(src) == []


def test_branch_where_a_type_guard_says_no_tensor_is_silent():
    # torch-ngp's loss: a tensor interval is saved, a number is kept on ctx
    body = """        if torch.is_tensor(alpha):
            ctx.save_for_backward(x, alpha)
            ctx.alpha = None
        else:
            ctx.save_for_backward(x)
            ctx.alpha = alpha
        if not isinstance(dim, torch.Tensor):
            ctx.dim = dim
        elif isinstance(dim, (int, float)):
            ctx.dim2 = dim
        else:
            ctx.dim3 = dim
        return x.exp()
"""
    assert lines(fn(body, "ctx.alpha * ctx.dim * ctx.dim2 * ctx.dim3")) == []


def test_branch_where_a_type_guard_says_tensor_is_flagged():
    body = """        ctx.save_for_backward(alpha)
        if torch.is_tensor(alpha):
            ctx.alpha = alpha
        if isinstance(x, float) or isinstance(x, torch.Tensor):
            ctx.x = x
        if isinstance(x, int):
            pass
        else:
            ctx.y = x
        return x.exp()
"""
    assert lines(fn(body, "ctx.alpha * ctx.x * ctx.y")) == [8, 10, 14]
