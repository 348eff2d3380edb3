"""TGL203 functional-dropout-ignores-eval on snippets, and its autofix."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.fixes import fix_until_stable
from torchgradlint.rules.functional_dropout_ignores_eval import FunctionalDropoutIgnoresEval

HEADER = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"


def module(body: str, header: str = HEADER, base: str = "nn.Module") -> str:
    return header + f"class M({base}):\n    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(body), "        ")


def lint(src: str):
    return lint_source(src, "x.py", [FunctionalDropoutIgnoresEval]).diagnostics


def lines(src: str) -> list[int]:
    return [d.line for d in lint(src) if d.code == "TGL203"]


@pytest.mark.parametrize("call", [
    "F.dropout(x)", "F.dropout(x, 0.5)", "F.dropout(x, p=self.p)", "F.dropout1d(x, 0.1)", "F.dropout2d(x, 0.1)",
    "F.dropout3d(x, 0.1)", "F.alpha_dropout(x, 0.1)", "F.feature_alpha_dropout(x, 0.1)",
    "nn.functional.dropout(x, 0.2)", "torch.dropout(x, 0.1, True)", "torch.alpha_dropout(x, 0.1, True)",
    "F.scaled_dot_product_attention(x, x, x, dropout_p=self.p)",
    "F.scaled_dot_product_attention(x, x, x, None, 0.1)",
])
def test_fires(call):
    assert lines(module(f"return {call}\n")) == [6]


@pytest.mark.parametrize("call", [
    "F.dropout(x, 0.5, training=self.training)", "F.dropout(x, 0.5, self.training)",
    "F.dropout(x, 0.5, training=train)", "F.dropout(x, 0.5, training=True)", "F.dropout(x, 0.5, training=False)",
    "F.dropout(x, p=0)", "F.dropout(x, 0.0)", "torch.dropout(x, 0.1, self.training)", "torch.dropout(x, 0.1, False)",
    "F.scaled_dot_product_attention(x, x, x)", "F.scaled_dot_product_attention(x, x, x, dropout_p=0.0)",
    "F.scaled_dot_product_attention(x, x, x, dropout_p=self.p if self.training else 0.0)",
    "F.scaled_dot_product_attention(x, x, x, dropout_p=0.0 if not self.training else self.p)",
    "F.dropout(x, *args)", "F.dropout(x, **kwargs)", "F.dropout(x, p=self.p if self.training else 0)",
])
def test_silent_forms(call):
    assert lines(module(f"return {call}\n")) == []


def test_silent_under_if_training_and_local_gated_dropout_p():
    assert lines(module("""
        if self.training:
            x = F.dropout(x, 0.5)
        p = self.p if self.training else 0.0
        x = F.scaled_dot_product_attention(x, x, x, dropout_p=p)
        if self.training:
            q = self.p
        else:
            q = 0.0
        return F.scaled_dot_product_attention(x, x, x, dropout_p=q)
    """)) == []


def test_silent_outside_module_methods():
    assert lines(HEADER + "def augment(x):\n    return F.dropout(x, 0.1)\n") == []
    assert lines(HEADER + "class Aug:\n    def __call__(self, x):\n        return F.dropout(x, 0.1)\n") == []
    assert lines(module("return F.dropout(x, 0.1)\n", base="object")) == []


def test_static_method_is_silent():
    src = HEADER + "class M(nn.Module):\n    @staticmethod\n    def f(x):\n        return F.dropout(x, 0.1)\n"
    assert lines(src) == []


def test_nested_function_in_method_fires():
    assert lines(module("""
        def inner(y):
            return F.dropout(y, 0.1)
        return inner(x)
    """)) == [8]


def test_other_frameworks_are_silent():
    mlx = "import mlx.nn as nn\nimport mlx.nn as F\n"
    assert lines(module("return F.dropout(x, 0.1)\n", header=mlx)) == []
    flax = "from flax import linen as nn\nimport torch.nn.functional as F\n"
    assert lines(module("return F.dropout(x, 0.1)\n", header=flax)) == []


def test_aliases():
    hdr = "import torch as T\nimport torch.nn.functional as Fn\nfrom torch.nn.functional import dropout\nfrom torch import nn\n"
    assert lines(module("x = Fn.dropout(x, 0.1)\nreturn dropout(x, 0.1) + T.dropout(x, 0.1, True)\n", header=hdr)) == [7, 8, 8]


def test_imported_base_with_forward_counts_as_a_module():
    src = HEADER + "from mylib import Block\nclass M(Block):\n    def forward(self, x):\n        return F.dropout(x, 0.1)\n"
    assert lines(src) == [7]
    no_forward = HEADER + "from mylib import Block\nclass M(Block):\n    def run(self, x):\n        return F.dropout(x, 0.1)\n"
    assert lines(no_forward) == []


def _fix(src: str) -> str:
    def run(text):
        return lint_source(text, "x.py", [FunctionalDropoutIgnoresEval]).diagnostics
    return fix_until_stable(src, run).source


@pytest.mark.parametrize("before, after", [
    ("F.dropout(x, 0.5)", "F.dropout(x, 0.5, training=self.training)"),
    ("F.dropout(x, p=0.5, )", "F.dropout(x, p=0.5, training=self.training)"),
    ("F.dropout(x, inplace=True)", "F.dropout(x, inplace=True, training=self.training)"),
    ("torch.dropout(x, 0.1, True)", "torch.dropout(x, 0.1, self.training)"),
    ("F.scaled_dot_product_attention(x, x, x, dropout_p=self.p)",
     "F.scaled_dot_product_attention(x, x, x, dropout_p=self.p if self.training else 0.0)"),
    ("F.scaled_dot_product_attention(x, x, x, dropout_p=a if b else c)",
     "F.scaled_dot_product_attention(x, x, x, dropout_p=(a if b else c) if self.training else 0.0)"),
])
def test_fix_output_parses_and_is_idempotent(before, after):
    src = module(f"return {before}\n")
    fixed = _fix(src)
    assert fixed == module(f"return {after}\n")
    compile(fixed, "x.py", "exec")
    assert lint(fixed) == []
    assert _fix(fixed) == fixed


def test_fix_uses_the_methods_own_self_name():
    src = HEADER + "class M(nn.Module):\n    def forward(me, x):\n        return F.dropout(x, 0.5)\n"
    assert "training=me.training" in _fix(src)


def test_multi_line_call_is_reported_without_fix():
    (d,) = lint(module("return F.dropout(\n    x,\n    0.5,\n)\n"))
    assert d.fix is None


def test_dropout_in_a_sampling_method_under_no_grad_is_deliberate():
    """Latent diffusion's ``p_sample`` (ControlNet, stable-diffusion): ``@torch.no_grad()`` and
    ``F.dropout(noise, p=noise_dropout)`` drops sampling noise on purpose, in any mode."""
    src = """
        import torch
        import torch.nn.functional as F
        from torch import nn

        class Diffusion(nn.Module):
            @torch.no_grad()
            def p_sample(self, x, noise_dropout=0.0):
                noise = torch.randn_like(x)
                if noise_dropout > 0.:
                    noise = F.dropout(noise, p=noise_dropout)
                return x + noise

            def sample_again(self, x):
                with torch.no_grad():
                    return F.dropout(x, p=0.1)

            def forward(self, x):
                return F.dropout(x, p=0.1)
        """
    assert [d.line for d in lint(textwrap.dedent(src))] == [19]


@pytest.mark.parametrize("signature, flagged", [
    ("x, drop_prob", False),  # kefirski/pytorch_RVAE: the caller passes 0. to validate and sample
    ("x, drop_prob=0.0", False),
    ("x, drop_prob=0.5", True),  # an evaluation call that passes nothing drops half its input
    ("x, *, drop_prob", False),
])
def test_a_rate_the_caller_passes_per_call_is_not_the_modules_mode(signature, flagged):
    src = HEADER + f"class Decoder(nn.Module):\n    def forward(self, {signature}):\n" \
        "        return F.dropout(x, drop_prob)\n"
    assert bool(lines(src)) is flagged
