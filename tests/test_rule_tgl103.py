"""TGL103 no-grad-not-entered on short snippets the fixtures do not cover."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.no_grad_not_entered import NoGradNotEntered


def lines(src: str) -> list[int]:
    """Lines of the TGL103 findings in ``src``."""
    result = lint_source(textwrap.dedent(src), "x.py", [NoGradNotEntered])
    return [d.line for d in result.diagnostics if d.code == "TGL103"]


@pytest.mark.parametrize("stmt", ["torch.no_grad()", "torch.inference_mode()", "torch.enable_grad()",
                                  "torch.autograd.no_grad()", "torch.autograd.grad_mode.inference_mode()",
                                  "(torch.no_grad())"])
def test_statement_is_flagged(stmt):
    assert lines(f"import torch\n{stmt}\n") == [2]


def test_aliases_resolve():
    assert lines("""\
        import torch as T
        from torch import no_grad as ng
        from torch.autograd import grad_mode
        T.no_grad()
        ng()
        grad_mode.enable_grad()
    """) == [4, 5, 6]


def test_inside_function_and_loop():
    assert lines("""\
        import torch
        def evaluate(model, loader):
            for x in loader:
                torch.no_grad()
                model(x)
    """) == [4]


@pytest.mark.parametrize("src", [
    "with torch.no_grad():\n    pass\n",
    "with torch.no_grad(), open('f') as f:\n    pass\n",
    "with (torch.no_grad(), torch.autocast('cpu')):\n    pass\n",
    "with (open('f') as f, torch.inference_mode()):\n    pass\n",
    "@torch.no_grad()\ndef f():\n    pass\n",
    "@torch.inference_mode()\ndef f():\n    pass\n",
    "ctx = torch.no_grad()\nwith ctx:\n    pass\n",
    "torch.set_grad_enabled(False)\n",
    "torch.no_grad().__enter__()\n",
    "x = [torch.no_grad()]\n",
    "print(torch.no_grad())\n",
    "return_value = torch.inference_mode(False)\n",
])
def test_near_misses_are_silent(src):
    assert lines("import torch\n" + src) == []


def test_other_frameworks_no_grad_is_silent():
    # a name only spelled like torch's: paddle.no_grad is a decorator/context too, but not torch's
    assert lines("import paddle\npaddle.no_grad()\n") == []
    assert lines("from mylib import no_grad\nno_grad()\n") == []


def test_message_names_the_call_and_the_fix():
    result = lint_source("import torch\ntorch.no_grad()\n", "x.py", [NoGradNotEntered])
    (d,) = result.diagnostics
    assert "with torch.no_grad():" in f"{d.message} {d.detail}" and d.fix is None
