"""The mode probes (harness/probes_modes.py) on tiny defective and healthy programs."""

import textwrap

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.harness.probes_modes import GradModeLeakProbe, TrainInEvalProbe  # noqa: E402
from torchgradlint.harness.worker import measure  # noqa: E402

STEPS = 3

HEAD = """
import torch
from torch import nn


def step(model, opt):
    opt.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    opt.step()
"""


def run(tmp_path, body: str, probe: str) -> dict:
    path = tmp_path / "prog.py"
    path.write_text(HEAD + textwrap.dedent(body), encoding="utf-8")
    result = measure(path, probe, "cpu", STEPS)
    assert result["error"] is None, result["error"]
    return result["measurement"]


# -- grad-mode-leak (TGL005) -------------------------------------------------------------------
LEAK = """
def evaluate(model):
    {switch}
    return model(torch.randn(8, 4)).sum().item()


def main(device, steps):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        step(model, opt)
        evaluate(model)
"""


@pytest.mark.parametrize("switch", ["torch.set_grad_enabled(False)", "torch.no_grad().__enter__()"])
def test_grad_mode_leak_claims_the_error_after_a_helper_left_grad_off(tmp_path, switch):
    m = run(tmp_path, LEAK.format(switch=switch), GradModeLeakProbe.name)
    assert m["defect"] is True
    assert m["figure"] == 1  # the second step's backward raises; the run stops there
    run_n = m["details"]["runs"][str(STEPS)]
    assert run_n["backwards"] == 2 and len(run_n["errors"]) == 1
    (finding,) = m["findings"]
    assert finding["code"] == "TGL005" and finding["stack"][0][1] == HEAD.count("\n") + 3  # the switch's line


@pytest.mark.parametrize("switch", ["pass", "torch.inference_mode().__enter__()",
                                    "torch.set_grad_enabled(False); torch.set_grad_enabled(True)"])
def test_grad_mode_leak_healthy_when_nothing_outlives_its_place(tmp_path, switch):
    m = run(tmp_path, LEAK.format(switch=switch), GradModeLeakProbe.name)
    assert m["defect"] is False and m["figure"] == 0
    assert m["details"]["runs"][str(STEPS)]["backwards"] == STEPS


def test_grad_mode_leak_ignores_a_with_block_around_backward(tmp_path):
    m = run(tmp_path, """
def main(device, steps):
    model = nn.Linear(4, 2)
    for _ in range(steps):
        loss = model(torch.randn(8, 4)).sum()
        with torch.no_grad():
            loss.backward()  # works: the graph was recorded before the block
""", GradModeLeakProbe.name)
    assert m["defect"] is False and m["details"]["runs"][str(STEPS)]["backwards"] == STEPS


def test_grad_mode_leak_sees_a_loop_that_comes_round(tmp_path):
    m = run(tmp_path, """
def main(device, steps):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        torch.set_grad_enabled(True)
        with torch.enable_grad():
            step(model, opt)
        torch.set_grad_enabled(False)
        model(torch.randn(8, 4))
        torch.set_grad_enabled(True)
""", GradModeLeakProbe.name)
    assert m["defect"] is False
    m = run(tmp_path, """
def main(device, steps):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        step(model, opt)
        torch.set_grad_enabled(False)
""", GradModeLeakProbe.name)
    assert m["defect"] is True and m["figure"] == 1  # the second iteration's backward raises
    (finding,) = m["findings"]
    assert finding["stack"][0][1] == HEAD.count("\n") + 7  # the switch, later in the loop body


def test_grad_mode_leak_keeps_the_switch_in_force_when_a_later_one_changes_nothing(tmp_path):
    # after the leaked switch, a no_grad block (inside a probe, or the user's) enters and exits with grad
    # mode already off: the switch in force is still the helper's, not the block's line
    m = run(tmp_path, """
def evaluate(model):
    torch.set_grad_enabled(False)
    return model(torch.randn(8, 4)).sum().item()


def main(device, steps):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        with torch.no_grad():
            pass
        step(model, opt)
        evaluate(model)
""", GradModeLeakProbe.name)
    assert m["defect"] is True
    (finding,) = m["findings"]
    assert finding["stack"][0][1] == HEAD.count("\n") + 3  # set_grad_enabled(False) in evaluate


def test_grad_mode_leak_ignores_a_probes_own_switch():
    from torchgradlint.harness import instrument

    probe = GradModeLeakProbe()
    with probe.observe("cpu", 1):
        with torch.no_grad():  # this test file is the user's; a frame of torchgradlint's own is not
            pass
        probe._site = None
        own = compile("import torch\nwith torch.no_grad():\n    site = probe._site\n",
                      instrument.__file__, "exec")
        scope = {"probe": probe}
        exec(own, scope)  # runs as if inside torchgradlint (its file name): a probe's own no_grad
        assert scope["site"] is None


def test_grad_mode_leak_restores_the_mode_it_found():
    probe = GradModeLeakProbe()
    with probe.observe("cpu", 1):
        torch.set_grad_enabled(False)
    assert torch.is_grad_enabled()
    assert torch.set_grad_enabled.__init__ is not None and probe.sample()["backwards"] == 0


# -- train-in-eval (TGL202) --------------------------------------------------------------------
MODES = """
def main(device, steps):
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for epoch in range(2):
        {top}
        for _ in range(steps):
            step(model, opt)
        model.eval()
        with torch.no_grad():
            model(torch.randn(8, 4))
"""


def test_train_in_eval_counts_training_forwards_in_eval_mode(tmp_path):
    m = run(tmp_path, MODES.format(top="pass"), TrainInEvalProbe.name)
    assert m["defect"] is True
    run_n = m["details"]["runs"][str(STEPS)]
    assert run_n["training_forwards"] == 2 * STEPS and run_n["eval_mode"] == STEPS
    assert m["figure"] == 0.5
    assert run_n["bn_forwards"] == 2 * STEPS and run_n["bn_updated"] == STEPS  # frozen statistics in epoch 2
    (finding,) = m["findings"]
    assert finding["code"] == "TGL202" and finding["stack"][0][1] == HEAD.count("\n") + 10  # model.eval()


def test_train_in_eval_healthy_when_train_runs_each_epoch(tmp_path):
    m = run(tmp_path, MODES.format(top="model.train()"), TrainInEvalProbe.name)
    assert m["defect"] is False and m["figure"] == 0.0
    run_n = m["details"]["runs"][str(STEPS)]
    assert run_n["training_forwards"] == 2 * STEPS and run_n["bn_updated"] == 2 * STEPS


def test_train_in_eval_ignores_modules_without_mode_layers_and_eval_forwards(tmp_path):
    m = run(tmp_path, MODES.format(top="pass").replace(
        "nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 2))",
        "nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))"), TrainInEvalProbe.name)
    assert m["defect"] is False and m["details"]["runs"][str(STEPS)]["training_forwards"] == 0


def test_train_in_eval_restores_module_train():
    original = torch.nn.Module.train
    probe = TrainInEvalProbe()
    with probe.observe("cpu", 1):
        assert torch.nn.Module.train is not original
    assert torch.nn.Module.train is original


# -- module-mode (TGL201): Monte-Carlo dropout by an explicit train() ------------------------------
MC = """
def main(device, steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), {layers}nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4)
    for _ in range(steps):
        {top}
        with torch.no_grad():
            {sample}
        step(model, opt)
    model.train()
    with torch.no_grad():
        {sample}
"""


def _module_mode(tmp_path, **fields) -> dict:
    from torchgradlint.harness.probes import ModuleModeProbe

    spec = {"layers": "nn.Dropout(0.5), ", "top": "pass", "sample": "samples = [model(x) for _ in range(5)]"}
    spec.update(fields)
    m = run(tmp_path, MC.format(**spec), ModuleModeProbe.name)
    return m


def test_module_mode_monte_carlo_sampling_after_an_explicit_train_is_deliberate(tmp_path):
    # only the final sampling: the loop's samples run in the training mode the steps left
    m = _module_mode(tmp_path, top="model.eval()")
    assert m["defect"] is False
    assert m["details"]["runs"][str(STEPS)]["deliberate_calls"] == 5


def test_module_mode_a_switch_followed_by_training_is_no_sampling(tmp_path):
    # ``model.train()`` at the top of each step, samples, then the step's backward: counted
    m = _module_mode(tmp_path, top="model.train()")
    run_n = m["details"]["runs"][str(STEPS)]
    assert m["defect"] is True and run_n["calls"] == 5 * STEPS and run_n["deliberate_calls"] == 5


def test_module_mode_one_forward_after_an_explicit_train_is_counted(tmp_path):
    m = _module_mode(tmp_path, top="model.eval()", sample="once = model(x)")
    assert m["defect"] is True and m["details"]["runs"][str(STEPS)]["calls"] == 1


def test_module_mode_batch_norm_under_an_explicit_train_is_counted(tmp_path):
    m = _module_mode(tmp_path, top="model.eval()", layers="nn.BatchNorm1d(8), nn.Dropout(0.5), ")
    run_n = m["details"]["runs"][str(STEPS)]
    assert m["defect"] is True and run_n["norm_calls"] == 5 and run_n["deliberate_calls"] == 5


def test_module_mode_restores_module_train():
    from torchgradlint.harness.probes import ModuleModeProbe

    original = torch.nn.Module.train
    with ModuleModeProbe().observe("cpu", 1):
        assert torch.nn.Module.train is not original
    assert torch.nn.Module.train is original
