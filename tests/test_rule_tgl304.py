"""TGL304 gradcheck-float32 on short snippets the fixtures do not cover."""

import pytest
from rule_snippets import finding_lines

from torchgradlint.rules.gradcheck_float32 import GradcheckFloat32


def lines(src: str) -> list[int]:
    return finding_lines(GradcheckFloat32, src)


def test_default_float_factory_is_flagged():
    assert lines("""
        import torch
        x = torch.randn(3, 3, requires_grad=True)
        torch.autograd.gradcheck(torch.sin, (x,))
    """) == [4]


def test_submodule_spelling_and_gradgradcheck_alias():
    assert lines("""
        import torch
        import torch.autograd.gradcheck
        from torch.autograd import gradgradcheck as ggc
        x = torch.rand(3, requires_grad=True)
        torch.autograd.gradcheck.gradcheck(torch.sin, x)
        ggc(torch.sin, [x])
    """) == [6, 7]


def test_keyword_inputs_and_float_literal_tensor():
    assert lines("""
        import torch
        x = torch.tensor([1.0, 2.0], requires_grad=True)
        torch.autograd.gradcheck(func=torch.exp, inputs=(x,))
    """) == [4]


def test_arithmetic_and_ops_keep_float32():
    assert lines("""
        import torch
        a = torch.rand(4) * 0.01
        b = torch.sigmoid(a)
        torch.autograd.gradcheck(torch.exp, (b.requires_grad_(),))
    """) == [5]


def test_float64_inputs_are_silent():
    assert lines("""
        import torch
        x = torch.randn(3, dtype=torch.float64, requires_grad=True)
        y = torch.randn(3, dtype=torch.double).requires_grad_()
        z = torch.randn(3).double()
        w = torch.randn(3).to(torch.float64)
        torch.autograd.gradcheck(torch.add, (x, y))
        torch.autograd.gradcheck(torch.add, (z, w))
    """) == []


def test_dtype_through_a_local_name_is_followed():
    assert lines("""
        import torch
        def test():
            dtype = torch.float64
            x = torch.rand(2, 3, dtype=dtype, requires_grad=True)
            assert torch.autograd.gradcheck(torch.sin, (x,))
    """) == []


def test_one_double_input_promotes_the_computation():
    assert lines("""
        import torch
        x = torch.randn(3, dtype=torch.float64, requires_grad=True)
        s = torch.randn(3)
        torch.autograd.gradcheck(torch.mul, (x, s))
    """) == []


def test_complex_and_integer_inputs_are_silent():
    assert lines("""
        import torch
        z = torch.randn(3, dtype=torch.cdouble, requires_grad=True)
        idx = torch.randint(0, 3, (3,))
        torch.autograd.gradcheck(torch.abs, (z,))
        torch.autograd.gradcheck(torch.abs, (idx,))
    """) == []


def test_unknown_origin_is_silent():
    assert lines("""
        import torch
        def check(fn, inputs, x):
            torch.autograd.gradcheck(fn, inputs)
            torch.autograd.gradcheck(fn, (x,))
            torch.autograd.gradcheck(fn, (make_input(),))
    """) == []


def test_ambiguous_binding_is_silent():
    assert lines("""
        import torch
        if flag:
            x = torch.randn(3, requires_grad=True)
        else:
            x = torch.randn(3, dtype=torch.float64, requires_grad=True)
        torch.autograd.gradcheck(torch.sin, (x,))
    """) == []


def test_default_dtype_float64_in_the_file_is_silent():
    assert lines("""
        import torch
        torch.set_default_dtype(torch.float64)
        x = torch.randn(3, requires_grad=True)
        torch.autograd.gradcheck(torch.sin, (x,))
    """) == []


def test_explicit_float32_is_flagged_even_with_default_double():
    assert lines("""
        import torch
        torch.set_default_dtype(torch.float64)
        x = torch.randn(3, dtype=torch.float32, requires_grad=True)
        torch.autograd.gradcheck(torch.sin, (x,))
    """) == [5]


def test_other_gradcheck_is_not_torch():
    assert lines("""
        import torch
        from mylib.testing import gradcheck
        x = torch.randn(3, requires_grad=True)
        gradcheck(torch.sin, (x,))
    """) == []


@pytest.mark.parametrize("callers, flagged", [
    ("check(torch.randn(4, 3, requires_grad=True))", True),  # aman-17's interview notebooks
    ("check(torch.randn(4, 3, dtype=torch.float64, requires_grad=True))", False),
    ("check(torch.randn(4, 3, requires_grad=True))\ncheck(torch.randn(4, 3, dtype=torch.double, requires_grad=True))",
     False),  # callers disagree: unknown
    ("", False),  # no caller: unknown
])
def test_a_parameter_is_judged_by_what_its_same_file_callers_pass(callers, flagged):
    src = "import torch\n\n\ndef check(x):\n    return torch.autograd.gradcheck(lambda t: (t ** 2).sum(), x)\n\n\n" + callers + "\n"
    assert bool(lines(src)) is flagged
