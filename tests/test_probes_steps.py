"""The step-order probes (harness/probes_steps.py) on tiny defective and healthy programs."""

import textwrap

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.harness.probes_steps import ClipEffectProbe, DiscardedGradientProbe  # noqa: E402
from torchgradlint.harness.worker import measure  # noqa: E402

STEPS = 3
K = 4  # micro-batches per update

HEAD = """
import torch
from torch import nn
"""


def line_of(body: str, needle: str) -> int:
    """1-based line of ``needle`` in the program ``run`` writes for ``body``."""
    lines = (HEAD + textwrap.dedent(body)).splitlines()
    return next(i for i, line in enumerate(lines, start=1) if needle in line)


def run(tmp_path, body: str, probe: str) -> dict:
    path = tmp_path / "prog.py"
    path.write_text(HEAD + textwrap.dedent(body), encoding="utf-8")
    result = measure(path, probe, "cpu", STEPS)
    assert result["error"] is None, result["error"]
    return result["measurement"]


# -- discarded-gradients (TGL003) --------------------------------------------------------------
ACCUM = f"""
def main(device, steps):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range({K} * steps):
        RESET_TOP
        model(torch.randn(8, 4)).pow(2).mean().backward()
        if (i + 1) % {K} == 0:
            opt.step()
            RESET_BRANCH
"""


def accum(top: str = "pass", branch: str = "pass") -> str:
    return ACCUM.replace("RESET_TOP", top).replace("RESET_BRANCH", branch)


def test_discarded_counts_micro_batches_wiped_by_zero_grad(tmp_path):
    body = accum(top="opt.zero_grad()")
    m = run(tmp_path, body, DiscardedGradientProbe.name)
    assert m["defect"] is True
    assert m["figure"] == (K - 1) * STEPS  # all but the last micro-batch of every window
    assert m["display"] == f"discarded backwards: {(K - 1) * STEPS}/{K * STEPS} ({STEPS} optimizer steps)"
    (finding,) = m["findings"]
    assert finding["code"] == "TGL003" and finding["stack"][0][1] == line_of(body, "zero_grad")


def test_discarded_sees_resets_by_assignment_at_their_line(tmp_path):
    body = accum(top="[setattr(p, 'grad', None) for p in model.parameters()]")
    m = run(tmp_path, body, DiscardedGradientProbe.name)
    assert m["defect"] is True and m["figure"] == (K - 1) * STEPS
    (finding,) = m["findings"]  # seen by the grad property of nn.Parameter while observed
    assert finding["stack"][0][1] == line_of(body, "setattr(p, 'grad', None)")


def test_discarded_sees_a_helpers_assignment_with_the_call_on_the_stack(tmp_path):
    body = """
def clear(model):
    for p in model.parameters():
        p.grad = None

def main(device, steps):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(4 * steps):
        clear(model)
        model(torch.randn(8, 4)).pow(2).mean().backward()
        if (i + 1) % 4 == 0:
            opt.step()
"""
    m = run(tmp_path, body, DiscardedGradientProbe.name)
    (finding,) = m["findings"]
    assert [ln for _, ln in finding["stack"][:2]] == [line_of(body, "p.grad = None"), line_of(body, "    clear(model)")]


def test_discarded_sees_in_place_zeroing_at_the_next_backward(tmp_path):
    body = accum(top="[p.grad.zero_() for p in model.parameters() if p.grad is not None]")
    m = run(tmp_path, body, DiscardedGradientProbe.name)
    assert m["defect"] is True and m["figure"] == (K - 1) * STEPS
    (finding,) = m["findings"]  # found before the next backward adds: that backward's line
    assert finding["stack"][0][1] == line_of(body, ".backward()")


def test_discarded_grad_property_is_transparent_and_removed():
    p = torch.nn.Parameter(torch.ones(2))
    assert "grad" not in torch.nn.Parameter.__dict__
    with DiscardedGradientProbe().observe("cpu"):
        assert "grad" in torch.nn.Parameter.__dict__
        p.sum().backward()
        assert torch.equal(p.grad, torch.ones(2))
        p.grad = torch.full((2,), 3.0)
        assert torch.equal(p.grad, torch.full((2,), 3.0))
        del p.grad
        assert p.grad is None
    assert "grad" not in torch.nn.Parameter.__dict__


def test_discarded_healthy_for_an_lbfgs_closure_that_resets(tmp_path):
    # L-BFGS calls the closure several times inside one step(): each evaluation's reset is part of the step
    m = run(tmp_path, """
def main(device, steps):
    model = nn.Linear(4, 1)
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=4)
    x = torch.randn(16, 4)

    def closure():
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        return loss

    for _ in range(steps):
        opt.step(closure)
""", DiscardedGradientProbe.name)
    assert m["defect"] is False and m["details"]["runs"][str(STEPS)]["backwards"] > STEPS


def test_discarded_healthy_when_another_optimizer_used_the_backward(tmp_path):
    # GAN: the generator's backward fills the discriminator's gradients too; its reset drops them rightly
    m = run(tmp_path, """
def main(device, steps):
    G, D = nn.Linear(4, 4), nn.Linear(4, 1)
    opt_g = torch.optim.SGD(G.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(D.parameters(), lr=0.1)
    for _ in range(steps):
        fake = G(torch.randn(8, 4))
        opt_d.zero_grad()
        D(fake.detach()).mean().backward()
        opt_d.step()
        opt_g.zero_grad()
        (-D(fake)).mean().backward()
        opt_g.step()
""", DiscardedGradientProbe.name)
    assert m["defect"] is False


def test_discarded_ignores_gradients_a_clip_scaled_to_zero_before_the_step(tmp_path):
    # an overflowed total norm makes clip_grad_norm_ scale every gradient by 0 in place: not a reset
    m = run(tmp_path, """
def main(device, steps):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        for p in model.parameters():
            p.grad.mul_(0)
        opt.step()
""", DiscardedGradientProbe.name)
    assert m["defect"] is False


def test_discarded_healthy_when_reset_follows_the_step(tmp_path):
    m = run(tmp_path, accum(branch="opt.zero_grad()"), DiscardedGradientProbe.name)
    assert m["defect"] is False and m["figure"] == 0
    assert m["details"]["runs"][str(STEPS)]["backwards"] == K * STEPS


def test_discarded_ignores_non_finite_gradients_a_guard_skips(tmp_path):
    m = run(tmp_path, """
def main(device, steps):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(2 * steps):
        opt.zero_grad()
        x = torch.randn(8, 4)
        if i % 2:
            x[0, 0] = float("inf")
        model(x).pow(2).mean().backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if torch.isfinite(norm):
            opt.step()
""", DiscardedGradientProbe.name)
    assert m["defect"] is False
    assert m["details"]["runs"][str(STEPS)]["steps"] == STEPS


def test_discarded_ignores_parameters_no_optimizer_steps(tmp_path):
    # A frozen feature extractor's gradients are computed and reset, never stepped.
    m = run(tmp_path, """
def main(device, steps):
    probe_net = nn.Linear(4, 4)
    head = nn.Linear(4, 1)
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    for _ in range(steps):
        probe_net.zero_grad()
        opt.zero_grad()
        head(probe_net(torch.randn(8, 4))).pow(2).mean().backward()
        opt.step()
""", DiscardedGradientProbe.name)
    assert m["defect"] is False


def test_discarded_restores_zero_grad():
    before = (torch.optim.Optimizer.zero_grad, torch.nn.Module.zero_grad)
    with DiscardedGradientProbe().observe("cpu"):
        assert torch.optim.Optimizer.zero_grad is not before[0]
    assert (torch.optim.Optimizer.zero_grad, torch.nn.Module.zero_grad) == before


# -- clip-effect (TGL004) ----------------------------------------------------------------------
CLIP = """
def main(device, steps):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    for _ in range(steps):
        x = torch.randn(16, 4)
        opt.zero_grad()
        ORDER
"""
BACKWARD = "nn.functional.mse_loss(model(x), 100.0 * x.sum(1, keepdim=True)).backward()"


def clip_program(*lines: str) -> str:
    return CLIP.replace("ORDER", "\n        ".join(lines))


def test_clip_effect_measures_a_clip_after_the_step(tmp_path):
    body = clip_program(BACKWARD, "opt.step()", "nn.utils.clip_grad_norm_(model.parameters(), 1.0)")
    m = run(tmp_path, body, ClipEffectProbe.name)
    assert m["defect"] is True
    assert m["figure"] > 10  # the applied norm, in multiples of the cap
    run_n = m["details"]["runs"][str(STEPS)]
    assert run_n["sites"][0]["above"] == STEPS - 1  # the first step ran before any clip
    assert m["findings"][0]["stack"][0][1] == line_of(body, "clip_grad_norm_")


def test_clip_effect_measures_a_clip_before_the_backward(tmp_path):
    m = run(tmp_path, clip_program("nn.utils.clip_grad_norm_(model.parameters(), 1.0)", BACKWARD, "opt.step()"),
            ClipEffectProbe.name)
    assert m["defect"] is True
    assert m["details"]["runs"][str(STEPS)]["sites"][0]["empty"] == STEPS  # it never saw a gradient


def test_clip_effect_healthy_in_order(tmp_path):
    m = run(tmp_path, clip_program(BACKWARD, "nn.utils.clip_grad_norm_(model.parameters(), 1.0)", "opt.step()"),
            ClipEffectProbe.name)
    assert m["defect"] is False
    assert m["figure"] == pytest.approx(1.0, rel=1e-3)


def test_clip_effect_value_clipping(tmp_path):
    bad = run(tmp_path, clip_program(BACKWARD, "opt.step()", "nn.utils.clip_grad_value_(model.parameters(), 0.1)"),
              ClipEffectProbe.name)
    good = run(tmp_path, clip_program(BACKWARD, "nn.utils.clip_grad_value_(model.parameters(), 0.1)", "opt.step()"),
               ClipEffectProbe.name)
    assert bad["defect"] is True and good["defect"] is False
    assert good["figure"] == pytest.approx(1.0)


def test_clip_effect_infinite_cap_is_logging(tmp_path):
    m = run(tmp_path, clip_program(BACKWARD, "opt.step()",
                                   "nn.utils.clip_grad_norm_(model.parameters(), float('inf'))"),
            ClipEffectProbe.name)
    assert m["defect"] is False
    assert m["display"].startswith("no capped clip")


def test_clip_effect_sees_a_from_import(tmp_path):
    m = run(tmp_path, "from torch.nn.utils import clip_grad_norm_\n" + clip_program(
        BACKWARD, "opt.step()", "clip_grad_norm_(model.parameters(), 1.0)"), ClipEffectProbe.name)
    assert m["defect"] is True
