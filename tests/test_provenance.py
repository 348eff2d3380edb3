"""analysis.provenance: graph-attached / detached / unknown on short snippets."""

import textwrap

import libcst as cst
import pytest

from torchgradlint.analysis import build_model
from torchgradlint.analysis.provenance import (
    State,
    backpropagated_names,
    backward_target_names,
    computed_under_no_grad,
    is_graph_attached,
    is_loss_call,
    is_module_call,
    is_scalar_loss,
    module_names,
    provenance,
    returned_names,
)


def build(src: str):
    src = textwrap.dedent(src)
    return build_model(cst.parse_module(src), src, "x.py")


def probe(src: str, fn: str = "probe"):
    """Model plus the Call fact of the last ``probe(expr)`` call and its argument."""
    m = build(src)
    call = [c for c in m.calls if c.func_text == fn][-1]
    return m, call, call.arg(0)


@pytest.mark.parametrize("expr,state", [
    ("model(x)", State.ATTACHED),
    ("criterion(model(x), y)", State.ATTACHED),
    ("F.cross_entropy(out, y)", State.ATTACHED),
    ("model(x).mean().cpu()", State.ATTACHED),
    ("model(x) * 2 + 1", State.ATTACHED),
    ("model(x).item()", State.DETACHED),
    ("model(x).detach()", State.DETACHED),
    ("model(x).tolist()", State.DETACHED),
    ("float(model(x).sum())", State.DETACHED),
    ("model(x).data", State.DETACHED),
    ("torch.zeros(3)", State.DETACHED),
    ("torch.zeros(3, requires_grad=True)", State.ATTACHED),
    ("model(x).argmax(1)", State.DETACHED),
    ("torch.argmax(model(x), 1)", State.DETACHED),
    ("helper(x)", State.UNKNOWN),
    ("(model(x) == y).sum()", State.DETACHED),
])
def test_expression_states_with_grad_enabled(expr, state):
    m, call, arg = probe(f"""
        import torch
        import torch.nn.functional as F
        from torch import nn
        model = nn.Linear(2, 2)
        criterion = nn.MSELoss()
        probe({expr})
        """)
    assert provenance(m, arg, call).state is state


def test_names_are_followed_through_bindings():
    m, call, arg = probe("""
        import torch
        out = net(x)
        loss = (out - y).pow(2).mean()
        probe(loss)
        """)
    assert is_graph_attached(m, arg, call) is True
    assert provenance(m, arg, call).sources  # the net(x) call


def test_attached_on_one_branch_may_hold_a_graph():
    m, call, arg = probe("""
        import torch
        if cond:
            loss = model(x).sum()
        else:
            loss = model(x).sum().item()
        probe(loss)
        """)
    assert provenance(m, arg, call).state is State.ATTACHED


def test_unknown_on_one_branch_is_unknown():
    m, call, arg = probe("""
        import torch
        if cond:
            loss = model(x).sum()
        else:
            loss = helper(x)
        probe(loss)
        """)
    assert provenance(m, arg, call).state is State.UNKNOWN


def test_computed_under_no_grad_names_the_region():
    m, call, arg = probe("""
        import torch as T
        with T.no_grad():
            loss = model(x).sum()
        probe(loss)
        """)
    region = computed_under_no_grad(m, arg, call)
    assert region is not None and region.api == "torch.no_grad"


@pytest.mark.parametrize("body", [
    "    w = torch.zeros(3, requires_grad=True)\nprobe(w)",
    "    w = torch.randn(3)\n    w.requires_grad_()\nprobe(w)",
    "    w = param\nprobe(w)",
    "    with torch.enable_grad():\n        w = model(x).sum()\nprobe(w)",
    "    w = model(x).sum().detach()\nprobe(w)",
])
def test_not_computed_under_no_grad(body):
    m, call, arg = probe("import torch\nwith torch.no_grad():\n" + body + "\n")
    assert computed_under_no_grad(m, arg, call) is None


def test_decorated_function_and_same_file_callers():
    m, call, arg = probe("""
        import torch
        def forward_only(model, x):
            out = model(x)
            probe(out)
        @torch.inference_mode()
        def run():
            forward_only(model, x)
        """)
    assert computed_under_no_grad(m, arg, call) is not None


def test_non_literal_set_grad_enabled_is_unknown():
    m, call, arg = probe("""
        import torch
        with torch.set_grad_enabled(train):
            loss = model(x).sum()
        probe(loss)
        """)
    assert provenance(m, arg, call).state is State.UNKNOWN


def test_module_and_loss_recognition():
    m = build("""
        import torch
        from torch import nn
        class Net(nn.Module):
            pass
        enc = Net().to("cpu")
        crit = nn.CrossEntropyLoss(reduction="none")
        opt = torch.optim.SGD(thing.parameters(), lr=0.1)
        enc(x); crit(a, b); thing(x); self_made(x); nn.functional.mse_loss(a, b)
        """)
    assert {"enc", "crit", "thing"} <= module_names(m)
    calls = {c.func_text: c for c in m.calls}
    assert is_module_call(m, calls["enc"].node) and is_module_call(m, calls["thing"].node)
    assert not is_module_call(m, calls["self_made"].node)
    assert is_loss_call(m, calls["crit"].node) and is_loss_call(m, calls["nn.functional.mse_loss"].node)
    # reduction="none" is not a scalar loss
    assert not is_scalar_loss(m, calls["crit"].node, calls["crit"])
    assert is_scalar_loss(m, calls["nn.functional.mse_loss"].node, calls["crit"])


def test_backward_and_returned_names():
    m = build("""
        import torch
        def f(model, xs):
            losses = []
            for x in xs:
                losses.append(model(x).sum())
            total = torch.stack(losses).sum()
            total.backward()
            return losses
        """)
    scope = m.functions["f"][0]
    assert backward_target_names(m, scope) == {"total"}
    assert "losses" in backpropagated_names(m, scope)
    assert returned_names(m, scope) == {"losses"}
