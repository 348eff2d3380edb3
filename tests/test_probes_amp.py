"""The AMP probes (TGL301, TGL302) on tiny defective and healthy programs, run in-process."""

import math

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.harness.probe_registry import all_probes  # noqa: E402
from torchgradlint.harness.probes_amp import AmpClipScaleProbe, AmpScalerBypassProbe, ScaleUnits  # noqa: E402
from torchgradlint.harness.runner import rule_probes  # noqa: E402
from test_probes_numerics import observed as observed_twice  # noqa: E402

STEPS = 3


def observed(probe_cls, program) -> dict:
    """The measurement of ``program()`` (3 iterations) run twice under fresh probes (keys "3", "6")."""
    return observed_twice(probe_cls, program, steps=STEPS)


def _setup(enabled: bool = True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=enabled)
    return model, opt, scaler


def _loss(model, dtype=torch.bfloat16):
    x = torch.randn(32, 6)
    with torch.autocast("cpu", dtype=dtype):
        out = model(x)
    return torch.nn.functional.mse_loss(out.float(), x.sum(1, keepdim=True) * 3)


def test_probes_are_registered_for_their_rules():
    assert rule_probes()["TGL301"] == "amp-clip-scale" and rule_probes()["TGL302"] == "amp-scaler-bypass"
    assert {"amp-clip-scale", "amp-scaler-bypass"} <= set(all_probes())


def test_scale_units_carry_the_scale_through_products_only():
    s = ScaleUnits.of(65536.0, 65536.0)
    for product in (2 * s, s * 0.5, 1.0 * s):
        assert isinstance(product, ScaleUnits) and product.scale == 65536.0
    assert 2 * s == 131072.0
    assert not isinstance(s / 2, ScaleUnits) and not isinstance(s + 1, ScaleUnits)


def _clip_program(unscale: bool, through_scale: bool = False, value: bool = False, enabled: bool = True):
    def program():
        model, opt, scaler = _setup(enabled)
        for _ in range(STEPS):
            opt.zero_grad()
            scaler.scale(_loss(model)).backward()
            if unscale:
                scaler.unscale_(opt)
            if value:
                torch.nn.utils.clip_grad_value_(model.parameters(), 0.01)
            else:
                limit = 0.1 * scaler.get_scale() if through_scale else 0.1
                torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
            scaler.step(opt)
            scaler.update()
    return program


def test_clip_before_unscale_caps_the_update_at_threshold_over_scale():
    m = observed(AmpClipScaleProbe, _clip_program(unscale=False))
    assert m["defect"] is True
    assert m["figure"] == pytest.approx(1 / 65536, rel=1e-3)
    site = m["details"]["runs"]["3"]["sites"][0]
    assert site["factor"] == pytest.approx(65536, rel=1e-3) and site["applied"] == pytest.approx(0.1 / 65536, rel=1e-3)
    assert m["findings"] and m["findings"][0]["code"] == "TGL301"
    assert m["findings"][0]["stack"][0][0] == __file__


def test_clip_value_before_unscale_is_measured_too():
    m = observed(AmpClipScaleProbe, _clip_program(unscale=False, value=True))
    assert m["defect"] is True and m["figure"] == pytest.approx(1 / 65536, rel=1e-3)


@pytest.mark.parametrize("kwargs", [{"unscale": True}, {"unscale": False, "through_scale": True},
                                    {"unscale": True, "value": True}])
def test_healthy_clips_cap_the_update_at_the_threshold(kwargs):
    m = observed(AmpClipScaleProbe, _clip_program(**kwargs))
    assert m["defect"] is False
    assert m["figure"] == pytest.approx(1.0, rel=1e-3)
    assert m["details"]["runs"]["3"]["clipped"] == 3 and m["findings"] == []


def test_clips_without_an_enabled_scaler_are_not_judged():
    # no GradScaler scaled a loss: a clip has no scale factor to miss (a clip after the step is TGL004's)
    m = observed(AmpClipScaleProbe, _clip_program(unscale=False, enabled=False))
    assert m["defect"] is False and m["details"]["runs"]["3"]["clips"] == 0

    def after_step():
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(STEPS):
            opt.zero_grad()
            (100 * model(torch.randn(8, 4))).pow(2).mean().backward()
            opt.step()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)

    m = observed(AmpClipScaleProbe, after_step)
    assert m["defect"] is False and m["details"]["runs"]["3"]["clips"] == 0


def _plain_step_program(unscale: bool, update: bool, dtype=torch.bfloat16, enabled: bool = True):
    def program():
        model, opt, scaler = _setup(enabled)
        for _ in range(STEPS):
            opt.zero_grad()
            scaler.scale(_loss(model, dtype)).backward()
            if unscale:
                scaler.unscale_(opt)
            opt.step()
            if update:
                scaler.update()
    return program


def test_plain_step_after_scaled_backward_applies_scaled_gradients():
    m = observed(AmpScalerBypassProbe, _plain_step_program(unscale=False, update=False))
    assert m["defect"] is True
    run = m["details"]["runs"]["3"]
    assert run["scaled_steps"] == 3 and run["max_factor"] == 65536.0 and m["figure"] == 3.0
    assert m["findings"][0]["stack"][0][0] == __file__


def test_update_after_plain_step_raises_and_is_claimed():
    m = observed(AmpScalerBypassProbe, _plain_step_program(unscale=False, update=True))
    assert m["defect"] is True
    run = m["details"]["runs"]["3"]
    assert run["scaled_steps"] == 1 and "No inf checks were recorded" in run["errors"][0]["error"]


def test_plain_step_after_unscale_applies_overflowed_gradients():
    m = observed(AmpScalerBypassProbe, _plain_step_program(unscale=True, update=True, dtype=torch.float16))
    assert m["defect"] is True
    run = m["details"]["runs"]["3"]
    assert run["scaled_steps"] == 0 and run["nonfinite_steps"] >= 1


def test_step_without_update_raises_and_is_claimed():
    def program():
        model, opt, scaler = _setup()
        for _ in range(STEPS):
            opt.zero_grad()
            scaler.scale(_loss(model)).backward()
            scaler.step(opt)

    m = observed(AmpScalerBypassProbe, program)
    assert m["defect"] is True
    assert "step() has already been called" in m["details"]["runs"]["3"]["errors"][0]["error"]
    assert m["findings"][0]["stack"][0][0] == __file__


def test_other_errors_are_not_claimed():
    assert AmpScalerBypassProbe().on_exception(RuntimeError("CUDA out of memory")) is False


def test_healthy_scaler_use_and_disabled_scaler_are_not_defects():
    def program():
        model, opt, scaler = _setup()
        for _ in range(STEPS):
            opt.zero_grad()
            scaler.scale(_loss(model, torch.float16)).backward()
            scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()

    for prog in (program, _plain_step_program(unscale=False, update=True, enabled=False)):
        m = observed(AmpScalerBypassProbe, prog)
        assert m["defect"] is False and m["figure"] == 0.0 and m["findings"] == []
        run = m["details"]["runs"]["3"]
        assert run["scaler_steps"] + run["steps_total"] >= 3  # stepped (or skipped by scaler.step) each time


def test_probes_restore_what_they_patch():
    from torch.amp.grad_scaler import GradScaler

    before = {n: GradScaler.__dict__[n] for n in ("scale", "unscale_", "step", "update", "get_scale")}
    clip_value = torch.nn.utils.clip_grad_value_
    for cls in (AmpClipScaleProbe, AmpScalerBypassProbe):
        with cls().observe("cpu", 1):
            pass
    assert {n: GradScaler.__dict__[n] for n in before} == before
    assert torch.nn.utils.clip_grad_value_ is clip_value
    assert not math.isnan(float(torch.amp.GradScaler("cpu").get_scale()))
