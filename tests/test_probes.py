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
FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
STEPS = 4


def run(program: str, probe: str, steps: int = STEPS) -> dict:
    result = measure(PROGRAMS / f"{program}.py", probe, "cpu", steps)
    assert result["error"] is None, result["error"]
    return result["measurement"]


def run_fixture(name: str, probe: str) -> dict:
    result = measure(FIXTURES / f"{name}.py", probe, "cpu", STEPS)
    assert result["error"] is None, result["error"]
    return result["measurement"]


@pytest.mark.parametrize("program, defect", [
    ("stale_bad", True), ("stale_ok", False), ("stale_ok_accumulation", False),
    ("stale_ok_gan_two_optimizers", False), ("stale_ok_gan_repaired", False),
    ("stale_bad_clipped", True), ("stale_ok_zeroed_in_place", False),
    ("stale_ok_autograd_grad_before_reset", False),
])
def test_stale_gradients(program, defect):
    m = run(program, StaleGradientProbe.name)
    assert m["defect"] is defect
    assert m["unit"] == "steps"
    if defect:
        assert m["display"] == f"stale-gradient steps: {STEPS - 1}/{STEPS}"
    else:
        assert m["figure"] == 0


@pytest.mark.parametrize("fixture, defect", [
    ("TGL001/bad_shared_model_grads_by_reference", True), ("TGL001/bad_push_and_pull", True),
    ("TGL001/ok_shared_model_grads_local_reset", False), ("TGL001/ok_shared_model_grads_zeroed_in_place", False),
])
def test_stale_gradients_handed_over_by_reference(fixture, defect):
    """A3C workers: the shared parameters' gradients are the local model's tensors. The first step
    finds their owners, so the steps from the third on are the stale ones."""
    m = run_fixture(fixture, StaleGradientProbe.name)
    assert m["defect"] is defect
    assert m["figure"] == (STEPS - 2 if defect else 0)


def test_stale_gradients_assigned_by_hand_are_looked_up_once(monkeypatch):
    """Gradients assigned by hand each step (``p.grad = g``, copies to a mirror model) are healthy,
    and their owners are looked for once per parameter, not at every step."""
    import gc

    passes = []
    real = gc.get_objects
    monkeypatch.setattr(gc, "get_objects", lambda *a: passes.append(1) or real(*a))
    counts = []
    for steps in (STEPS, 4 * STEPS):
        passes.clear()
        m = run("stale_ok_assigned_grads", StaleGradientProbe.name, steps)
        assert m["defect"] is False and m["figure"] == 0
        counts.append(len(passes))
    runs = len(StaleGradientProbe.schedule)  # the harness runs the program at N, 2N...
    assert counts == [2 * runs, 2 * runs]  # one pass per optimizer (at its second step), whatever N


def test_a_gradient_holds_its_sum_when_scaled_in_place_not_when_zeroed_or_replaced():
    from torchgradlint.harness.probe_base import grad_mark
    from torchgradlint.harness.probes import _holds

    g = torch.ones(3)
    mark = grad_mark(g)
    assert _holds(g, mark)
    g.mul_(0.5)  # unscale_ / clip_grad_norm_
    assert _holds(g, mark)
    g.zero_()  # zero_grad(set_to_none=False)
    assert not _holds(g, mark)
    old = torch.ones(3)
    mark = grad_mark(old)
    del old  # zero_grad(): the gradient is freed; a new one may take its address and its id
    new = torch.ones(3)
    assert not _holds(new, mark)
    assert not _holds(None, mark) and not _holds(new, None)


def test_stale_gradients_attributed_per_parameter_group():
    m = run("stale_bad_one_group", StaleGradientProbe.name)
    assert m["defect"] is True
    assert [f["display"] for f in m["findings"]] == [f"SGD#1 group 0: stale-gradient steps {STEPS - 1}/{STEPS}"]
    groups = m["details"]["runs"][str(STEPS)]["groups"]
    assert groups["SGD#1 group 1"]["stale_steps"] == 0
    path, line = m["findings"][0]["stack"][0]
    assert path.endswith("stale_bad_one_group.py") and line == 16  # opt.step()


def test_optimizers_are_labelled_by_object_not_by_id():
    """A loop that builds an optimizer per iteration: each is its own group, though a new optimizer
    often takes the address (the ``id``) of the one just freed."""
    probe = StaleGradientProbe()
    layer = torch.nn.Linear(2, 1)
    labels = []
    for _ in range(6):
        opt = torch.optim.SGD(layer.parameters(), lr=0.1)
        labels.append(probe._label(opt))
        del opt
    assert labels == [f"SGD#{i}" for i in range(1, 7)]


def test_stale_gradients_copy_no_gradient(monkeypatch):
    """The probe identifies gradient contents by version counter: it never clones a gradient."""
    clones = []
    orig = torch.Tensor.clone
    monkeypatch.setattr(torch.Tensor, "clone", lambda self, *a, **k: clones.append(self.shape) or orig(self, *a, **k))
    m = run("stale_bad", StaleGradientProbe.name)
    assert m["defect"] is True and clones == []


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


def test_grad_mode_detach_bug_is_not_claimed():
    """The backward raises autograd's error, but grad mode was on: a .detach() bug, not TGL002."""
    result = measure(PROGRAMS / "gradmode_detach_bug.py", GradModeProbe.name, "cpu", STEPS)
    assert result["measurement"] is None
    assert "does not require grad" in result["error"]


def test_grad_mode_error_text_raised_elsewhere_is_not_claimed():
    result = measure(PROGRAMS / "gradmode_text_elsewhere.py", GradModeProbe.name, "cpu", STEPS)
    assert result["measurement"] is None and "RuntimeError" in result["error"]


def test_grad_mode_silent_failure():
    m = run("gradmode_bad_silent", GradModeProbe.name)
    assert m["defect"] is True
    assert m["display"].startswith("backward reaches no parameter")
    assert m["findings"][0]["stack"][0][1] == 16  # loss.backward()


def _events(probe: GradModeProbe) -> list:
    return [e["kind"] for e in probe.sample()["events"]]


def test_grad_mode_create_graph_results():
    x = torch.randn(3, requires_grad=True)
    probe = GradModeProbe()  # healthy: the penalty built from the result is backpropagated
    with probe.observe("cpu"):
        (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)
        g.pow(2).sum().backward()
    assert _events(probe) == []
    probe = GradModeProbe()  # defect: the penalty is computed under no_grad, no gradient flows
    with probe.observe("cpu"):
        (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)
        with torch.no_grad():
            penalty = g.pow(2).sum()
        ((x ** 2).sum() + penalty).backward()
    assert _events(probe) == ["unused"]
    probe = GradModeProbe()  # defect: a linear function's gradient carries no graph at all
    with probe.observe("cpu"):
        (g,) = torch.autograd.grad((x * 2).sum(), x, create_graph=True)
    assert g.requires_grad is False
    assert _events(probe) == ["graphless"]


def test_grad_mode_create_graph_result_of_an_evaluation_is_not_claimed():
    x = torch.randn(3, requires_grad=True)
    probe = GradModeProbe()
    with probe.observe("cpu"):
        (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)  # a training step
        ((x ** 2).sum() + g.pow(2).sum()).backward()
        with torch.no_grad():  # evaluation: the penalty as a metric, no backward follows it
            for _ in range(2):
                with torch.enable_grad():
                    y = (x ** 3).sum()
                (g,) = torch.autograd.grad(y, x, create_graph=True)
                assert g.requires_grad
                metric = g.pow(2).sum()
        (g,) = torch.autograd.grad((x ** 3).sum(), x, create_graph=True)  # the next training step
        ((x ** 2).sum() + g.pow(2).sum()).backward()
    assert metric.requires_grad is False
    assert _events(probe) == []
    probe = GradModeProbe()  # the same evaluation result with a backward right after it: claimed
    with probe.observe("cpu"):
        with torch.no_grad():
            with torch.enable_grad():
                y = (x ** 3).sum()
            (g,) = torch.autograd.grad(y, x, create_graph=True)
            metric = g.pow(2).sum()
        ((x ** 2).sum() + metric).backward()
    assert _events(probe) == ["unused"]


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


def test_retained_graph_dataset_slices_count_per_view():
    """Slices of one preallocated dataset count the bytes they span, not the whole storage."""
    m = run("retained_ok_dataset_slices", RetainedGraphProbe.name)
    assert m["defect"] is False, m["details"]["reasons"]
    assert m["details"]["saved_bytes_per_step"] == 0
    assert m["details"]["peak_saved_bytes_per_step"] == 0


def test_retained_graph_alias_fixture_figure_is_not_the_dataset():
    """bad_alias_torch_t read +49 KiB/step saved when whole storages were counted; it is a TGL102
    defect because each retained graph is alive at the next forward, not because of the dataset."""
    m = run_fixture("TGL102/bad_alias_torch_t", RetainedGraphProbe.name)
    assert abs(m["details"]["saved_bytes_per_step"]) < 1024
    assert [f["code"] for f in m["findings"]] == ["TGL102"]
    assert m["details"]["wasted_retain_per_step"] == pytest.approx(1.0)


def test_retain_graph_then_del_is_healthy():
    m = run("retained_ok_retain_then_del", RetainedGraphProbe.name)
    assert m["defect"] is False, m["details"]["reasons"]
    assert m["details"]["wasted_retain_per_step"] == 0


def test_slow_leak_one_loss_every_25_steps():
    m = run("retained_bad_slow_leak", RetainedGraphProbe.name, steps=13)  # 13, 26, 52 steps
    assert m["defect"] is True
    assert 0.1 <= m["details"]["nodes_per_step"] < 0.5  # the old 0.5 node/step bound missed it
    (finding,) = m["findings"]
    assert finding["code"] == "TGL101" and finding["stack"][0][1] == 17  # snapshots.append(loss)


def test_retained_graph_healthy():
    m = run("retained_ok", RetainedGraphProbe.name)
    assert m["defect"] is False, m["details"]["reasons"]
    assert m["details"]["nodes_per_step"] == 0


def test_retained_graph_unused_retain_every_step():
    m = run("retained_bad_retain", RetainedGraphProbe.name)
    assert m["defect"] is True
    assert m["details"]["wasted_retain_per_step"] >= 0.5
    assert {f["code"] for f in m["findings"]} == {"TGL102"}


def test_retained_graph_two_losses_near_miss():
    m = run("retained_ok_two_losses", RetainedGraphProbe.name)
    assert m["defect"] is False, m["details"]["reasons"]


@pytest.mark.parametrize("program, defect", [
    ("mode_bad", True), ("mode_ok", False), ("mode_ok_plain_layers", False),
    ("mode_bad_functional_dropout", True), ("mode_bad_attention", True),
    ("mode_ok_update_bn", False), ("mode_ok_mc_dropout", False),
    ("mode_ok_training_forward_under_no_grad", False), ("mode_bad_eval_helper_then_failed_backward", True),
])
def test_module_mode(program, defect):
    m = run(program, ModuleModeProbe.name)
    assert m["defect"] is defect
    if program == "mode_bad":
        runs = m["details"]["runs"][str(STEPS)]
        assert runs["norm_calls"] == STEPS and runs["dropout_calls"] == STEPS
        assert runs["running_stats_changed"] == STEPS


def test_module_mode_attention_dropouts_counted():
    runs = run("mode_bad_attention", ModuleModeProbe.name)["details"]["runs"][str(STEPS)]
    assert runs["dropout_calls"] == 2  # MultiheadAttention's attention dropout and SDPA dropout_p
    assert runs["sites"][0]["stack"][0][1] == 29  # block(...) under no_grad


def test_module_mode_deliberate_uses_counted_apart():
    assert run("mode_ok_update_bn", ModuleModeProbe.name)["details"]["runs"][str(STEPS)]["deliberate_calls"] >= 1
    assert run("mode_ok_mc_dropout", ModuleModeProbe.name)["details"]["runs"][str(STEPS)]["deliberate_calls"] == 10


def test_module_mode_training_forward_under_no_grad_is_tgl002s():
    """The calls of a forward whose backward (same frame) fails for grad mode are set apart; an
    evaluation helper's calls in the same iterations are still counted, at the helper's call."""
    ok = run("mode_ok_training_forward_under_no_grad", ModuleModeProbe.name)["details"]["runs"][str(STEPS)]
    assert ok["training_forward_calls"] == STEPS and ok["calls"] == 0
    m = run("mode_bad_eval_helper_then_failed_backward", ModuleModeProbe.name)
    runs = m["details"]["runs"][str(STEPS)]
    assert runs["calls"] == STEPS and runs["training_forward_calls"] == STEPS
    assert [f["stack"][0][1] for f in m["findings"]] == [10]  # evaluate's model(...) call


def test_human_bytes():
    assert human_bytes(6553.6, signed=True) == "+6.4 KiB"
    assert human_bytes(-512) == "-512 B"
    assert human_bytes(3 * 1024 * 1024) == "3.0 MiB"


def _samples(peaks, saved=None):
    """Checkpoint samples at 2, 4, 8 (, 16) backward calls with the given peak (and live) saved bytes."""
    xs = [2, 4, 8, 16][:len(peaks)]
    return {x: {"holders": {}, "holder_nodes": 10, "saved_bytes": (saved or [1000] * len(peaks))[i],
                "peak_saved_bytes": peaks[i], "wasted_retain_calls": 0, "reused_retain_calls": 0, "seconds": 0.1}
            for i, x in enumerate(xs)}


def test_peak_that_rises_in_warm_up_then_levels_is_not_growth():
    # ok_two_losses_first_retains under `run`: the first iteration's peak is lower (no earlier graph alive)
    m = RetainedGraphProbe.decide(_samples([79880, 114444, 114444]))
    assert m.defect is False
    assert m.findings == [] and m.details["peak_saved_bytes_per_step"] > RetainedGraphProbe.PEAK_GROWTH


def test_peak_that_keeps_rising_is_growth():
    m = RetainedGraphProbe.decide(_samples([80000, 120000, 200000]))
    assert m.defect is True and [f["code"] for f in m.findings] == ["TGL101"]


def test_live_saved_bytes_back_at_the_last_checkpoint_still_count_once_above_the_first():
    # live (not high-water) saved bytes: an epoch-periodic list sampled at 8 and 16 reads equal there
    m = RetainedGraphProbe.decide(_samples([50000] * 4, saved=[2000, 8000, 20000, 20000]))
    assert m.defect is True


def test_checkpoints_within_a_step_that_fill_up_then_stay_level_are_not_growth():
    """``run`` checkpoints at backward calls 1, 2, 4, ... 32 of a loop of 4 micro-batches per optimizer
    step (fixture TGL101/ok_micro_batch_outputs_one_step): the step's list holds 1, 2, 4, then always
    4 chunks' graphs. Rising again at the end is growth."""
    def samples(nodes):
        xs = [1, 2, 4, 8, 16, 32]
        return {x: {"holders": {"f.py:main:1:outputs": {"nodes": n, "lines": [22]}}, "holder_nodes": n,
                    "saved_bytes": 0, "peak_saved_bytes": 0, "wasted_retain_calls": 0, "reused_retain_calls": 0,
                    "seconds": 0.1} for x, n in zip(xs, nodes)}
    m = RetainedGraphProbe.decide(samples([3, 6, 12, 12, 12, 12]))
    assert m.defect is False and m.findings == []
    m = RetainedGraphProbe.decide(samples([3, 6, 12, 24, 48, 96]))
    assert m.defect is True and [f["code"] for f in m.findings] == ["TGL101"]


def test_grad_mode_stepped_parameters_that_never_get_a_gradient():
    # a module whose forward is decorated @torch.no_grad() after it was unfrozen
    m = run_fixture("TGL002/bad_unfreezable_tower_no_grad_forward", GradModeProbe.name)
    assert m["defect"] is True
    assert "never got a gradient" in m["display"]
    lines = [line for _, line in m["findings"][0]["stack"]]
    assert 20 in lines  # the @torch.no_grad() decorator of VisionTower.forward


@pytest.mark.parametrize("program", ["gradmode_ok_no_grad_generator_gan", "gradmode_ok_target_network"])
def test_grad_mode_no_grad_forwards_of_modules_trained_elsewhere_or_not_stepped(program):
    # a generator run under no_grad for the discriminator step, trained in its own step; a target
    # network whose parameters no optimizer steps
    m = run(program, GradModeProbe.name)
    assert m["defect"] is False, m["display"]


def test_carried_state_growth_without_a_store_is_not_tgl101(tmp_path):
    # `state = cell(x, state)` with grad mode on chains graphs, but nothing stores a loss: no TGL101 line
    prog = tmp_path / "decode.py"
    prog.write_text("import torch\n\n\ndef main(device='cpu', steps=4):\n    cell = torch.nn.GRUCell(4, 4)\n"
                    "    state = torch.zeros(2, 4)\n    for _ in range(steps):\n"
                    "        state = cell(torch.randn(2, 4), state)\n")
    result = measure(prog, RetainedGraphProbe.name, "cpu", STEPS)
    m = result["measurement"]
    assert m["details"]["nodes_per_step"] > 0 and m["details"]["carried_state"] == ["state"]
    assert m["defect"] is False and m["findings"] == []


def _stepped_reuse() -> None:
    """A retained graph backpropagated again after a step changed weights it saved (the
    second layer of ``g`` saved its weight: its input needs a gradient)."""
    torch.manual_seed(0)
    g = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 4))
    d = torch.nn.Linear(4, 1)
    opt_g = torch.optim.SGD(g.parameters(), lr=0.1)
    out = d(g(torch.randn(8, 4)))
    out.mean().backward(retain_graph=True)
    opt_g.step()
    (out ** 2).mean().backward()


def test_retained_graph_reused_after_a_step_fails_as_without_the_probe_and_is_claimed():
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        _stepped_reuse()  # what PyTorch itself raises, without any probe
    probe = RetainedGraphProbe(full_scan=False)
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as caught:
        with probe.observe("cpu"):
            _stepped_reuse()
    assert probe.on_exception(caught.value)  # saved-tensor hooks skip autograd's check: the probe makes it
    m = RetainedGraphProbe.decide({1: probe.sample()})
    assert m.defect and [f["code"] for f in m.findings] == ["TGL102"]


def test_a_saved_tensor_modified_in_place_fails_under_the_probe_unclaimed():
    # no retained graph and no step between: the error is the program's own, not this probe's defect
    probe = RetainedGraphProbe(full_scan=False)
    x = torch.randn(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation") as caught:
        with probe.observe("cpu"):
            y = x * 2
            z = y.sigmoid()  # saves its output
            z.add_(1)
            z.sum().backward()
    assert not probe.on_exception(caught.value)
    assert probe.sample()["stale"] == []
