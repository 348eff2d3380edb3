"""Each probe on small synthetic programs known healthy and known defective (tests/harness_programs/)."""

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.harness.probes import (  # noqa: E402
    GradModeProbe,
    ModuleModeProbe,
    RetainedGraphProbe,
    StaleGradientProbe,
    human_bytes,
)
from torchgradlint.harness.worker import measure  # noqa: E402

PROGRAMS = Path(__file__).resolve().parent / "harness_programs"
STEPS = 4


def run(program: str, probe: str) -> dict:
    result = measure(PROGRAMS / f"{program}.py", probe, "cpu", STEPS)
    assert result["error"] is None, result["error"]
    return result["measurement"]


@pytest.mark.parametrize("program, defect", [
    ("stale_bad", True), ("stale_ok", False), ("stale_ok_accumulation", False),
])
def test_stale_gradients(program, defect):
    m = run(program, StaleGradientProbe.name)
    assert m["defect"] is defect
    assert m["unit"] == "steps"
    if defect:
        assert m["display"] == f"stale-gradient steps: {STEPS - 1}/{STEPS}"
    else:
        assert m["figure"] == 0


def test_grad_mode_error_is_the_defect():
    m = run("gradmode_bad", GradModeProbe.name)
    assert m["defect"] is True
    assert "element 0 of tensors does not require grad" in m["display"]
    assert m["display"].startswith("RuntimeError")


def test_grad_mode_healthy_near_miss():
    m = run("gradmode_ok", GradModeProbe.name)
    assert m["defect"] is False and m["figure"] == 0


def test_grad_mode_does_not_claim_unrelated_errors():
    result = measure(PROGRAMS / "gradmode_crash.py", GradModeProbe.name, "cpu", STEPS)
    assert result["measurement"] is None
    assert "ValueError: unrelated" in result["error"]


def test_grad_mode_create_graph_results():
    from torchgradlint.harness.probes import install_autograd_wrappers

    install_autograd_wrappers()
    x = torch.randn(3, requires_grad=True)
    probe = GradModeProbe()  # healthy: the penalty built from the result is backpropagated
    with probe.observe("cpu", 1):
        (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)
        g.pow(2).sum().backward()
    assert probe.sample()["graphless_create_graph"] == 0
    probe = GradModeProbe()  # defect: the penalty is computed under no_grad, no gradient flows
    with probe.observe("cpu", 1):
        (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)
        with torch.no_grad():
            penalty = g.pow(2).sum()
        ((x ** 2).sum() + penalty).backward()
    assert probe.sample()["graphless_create_graph"] == 1
    probe = GradModeProbe()  # defect: a linear function's gradient carries no graph at all
    with probe.observe("cpu", 1):
        (g,) = torch.autograd.grad((x * 2).sum(), x, create_graph=True)
    assert g.requires_grad is False
    assert probe.sample()["graphless_create_graph"] == 1


def test_retained_graph_backward_every_step_keeps_bookkeeping():
    m = run("retained_bad_backward", RetainedGraphProbe.name)
    assert m["defect"] is True
    d = m["details"]
    assert d["nodes_per_step"] >= 1
    assert abs(d["saved_bytes_per_step"]) < 1024  # saved tensors are freed by backward
    assert m["unit"] == "B/step" and "/step" in m["display"]


def test_retained_graph_eval_without_no_grad_keeps_activations():
    m = run("retained_bad_eval", RetainedGraphProbe.name)
    assert m["defect"] is True
    # every step keeps its activations: 128x256 floats (tanh output) at least
    assert m["details"]["saved_bytes_per_step"] >= 128 * 256 * 4


def test_retained_graph_healthy():
    m = run("retained_ok", RetainedGraphProbe.name)
    assert m["defect"] is False, m["details"]["reasons"]
    assert m["details"]["nodes_per_step"] == 0


def test_retained_graph_unused_retain_every_step():
    m = run("retained_bad_retain", RetainedGraphProbe.name)
    assert m["defect"] is True
    assert m["details"]["wasted_retain_per_step"] >= 0.5


def test_retained_graph_two_losses_near_miss():
    m = run("retained_ok_two_losses", RetainedGraphProbe.name)
    assert m["defect"] is False, m["details"]["reasons"]


@pytest.mark.parametrize("program, defect", [
    ("mode_bad", True), ("mode_ok", False), ("mode_ok_plain_layers", False),
])
def test_module_mode(program, defect):
    m = run(program, ModuleModeProbe.name)
    assert m["defect"] is defect
    if defect:
        runs = m["details"]["runs"][str(STEPS)]
        assert runs["norm_calls"] == STEPS and runs["dropout_calls"] == STEPS
        assert runs["running_stats_changed"] == STEPS


def test_human_bytes():
    assert human_bytes(6553.6, signed=True) == "+6.4 KiB"
    assert human_bytes(-512) == "-512 B"
    assert human_bytes(3 * 1024 * 1024) == "3.0 MiB"
