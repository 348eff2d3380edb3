"""The numerics probes on tiny defective and healthy programs, run in-process."""

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.harness.probe_registry import all_probes  # noqa: E402
from torchgradlint.harness.probes_numerics import (  # noqa: E402
    CtxTensorProbe,
    GradcheckPowerProbe,
    NanParameterProbe,
    ProbabilityInputProbe,
    ce_floor,
    logit_gradient_ratio,
)
from torchgradlint.harness.runner import rule_probes  # noqa: E402


def observed(probe_cls, program, steps: int = 2) -> dict:
    """Run ``program()`` under a fresh probe at ``steps`` and ``2 * steps``; return the measurement."""
    samples = {}
    for n in (steps, 2 * steps):
        probe = probe_cls()
        with probe.observe("cpu", n):
            try:
                program()
            except Exception as exc:  # noqa: BLE001 - as the worker does
                if not probe.on_exception(exc):
                    raise
        samples[n] = probe.sample()
    return probe_cls.decide(samples).to_json()


def test_probes_are_registered_for_their_rules():
    for code, name in {"TGL104": "ctx-tensors", "TGL303": "probability-input", "TGL304": "gradcheck-power",
                       "TGL305": "nan-parameters"}.items():
        assert rule_probes()[code] == name and name in all_probes()


def _gradcheck(dtype, **tolerances):
    def program():
        from torch.autograd import gradcheck

        torch.manual_seed(0)
        x = torch.randn(6, 4, dtype=dtype, requires_grad=True)
        w = torch.randn(4, 3, dtype=dtype, requires_grad=True)
        gradcheck(lambda a, b: torch.tanh(a @ b), (x, w), raise_exception=False, **tolerances)
    return program


def test_gradcheck_power_float32_default_tolerances_fails_correct_backward():
    m = observed(GradcheckPowerProbe, _gradcheck(torch.float32))
    assert m["defect"] is True
    run = m["details"]["runs"]["2"]
    assert run["correct_failed"] == 1 and run["dtypes"] == ["float32"]


def test_gradcheck_power_float32_loosened_passes_wrong_backward():
    m = observed(GradcheckPowerProbe, _gradcheck(torch.float32, eps=1e-3, atol=1e-2, rtol=1e-2))
    assert m["defect"] is True
    assert m["details"]["runs"]["2"]["skewed_passed"] == 1


def test_gradcheck_power_float64_is_healthy():
    m = observed(GradcheckPowerProbe, _gradcheck(torch.float64))
    assert m["defect"] is False and m["figure"] == 0
    assert m["details"]["runs"]["2"] == {"checks": 1, "unreliable": 0, "correct_failed": 0, "skewed_passed": 0,
                                         "dtypes": ["float64"]}


def test_gradcheck_power_raised_check_is_the_measured_defect():
    def program():
        x = torch.randn(5, requires_grad=True)
        torch.autograd.gradcheck(torch.sin, (x,))

    assert observed(GradcheckPowerProbe, program)["defect"] is True


def test_gradcheck_power_restores_torch():
    import sys

    module = sys.modules["torch.autograd.gradcheck"]
    before = module._gradcheck_helper
    observed(GradcheckPowerProbe, _gradcheck(torch.float64))
    assert module._gradcheck_helper is before


class _ExpOnCtx(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.exp()
        ctx.out = out
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.out


class _ExpSaved(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        out = x.exp()
        ctx.save_for_backward(out)
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * out


def _train(fn, inplace=False, steps=4):
    def program():
        w = torch.randn(64, requires_grad=True)
        for _ in range(steps):
            y = fn(w)
            if inplace:
                y.mul_(2)
            y.sum().backward()
    return program


def test_ctx_tensors_output_on_ctx_leaves_dead_outputs_in_cycles():
    m = observed(CtxTensorProbe, _train(_ExpOnCtx.apply))
    run = m["details"]["runs"]["2"]
    assert m["defect"] is True and run["dead_outputs"] == 4 and run["dead_bytes"] == 4 * 64 * 4
    assert run["stale_reads"] == 0 and run["ctx_tensors"] == 4


def test_ctx_tensors_keeps_gc_on_and_counts_dead_outputs_its_runs_free():
    """gc is not disabled: a collection during the run frees the dead outputs, and they are counted."""
    import gc

    enabled = []

    def program():
        _train(_ExpOnCtx.apply)()
        enabled.append(gc.isenabled())
        gc.collect()  # the collector frees the 4 dead outputs now, mid-run

    m = observed(CtxTensorProbe, program)
    run = m["details"]["runs"]["2"]
    assert enabled == [True, True] and run["dead_outputs"] == 4


def test_ctx_tensors_output_freed_by_reference_counting_is_healthy():
    def program():
        w = torch.randn(64, requires_grad=True)
        for _ in range(4):
            y = _ExpOnCtx.apply(w)
            y.sum().backward()
            del y.grad_fn.out  # the user breaks the cycle: reference counting frees the output

    m = observed(CtxTensorProbe, program)
    assert m["defect"] is False and m["details"]["runs"]["2"]["dead_outputs"] == 0


def test_ctx_tensors_in_place_edit_before_backward_is_a_stale_read():
    alias = _ExpOnCtx.apply  # bound before the probe is installed: still seen
    m = observed(CtxTensorProbe, _train(alias, inplace=True))
    assert m["defect"] is True and m["details"]["runs"]["2"]["stale_reads"] == 4


def test_ctx_tensors_save_for_backward_is_healthy():
    m = observed(CtxTensorProbe, _train(_ExpSaved.apply))
    assert m["defect"] is False and m["figure"] == 0
    assert m["details"]["runs"]["2"]["forwards"] == 4 and m["details"]["runs"]["2"]["backwards"] == 4


def test_ctx_tensors_restores_autograd_and_gc():
    import gc

    from torch.autograd.function import BackwardCFunction, _SingleLevelFunction

    before = BackwardCFunction.apply
    observed(CtxTensorProbe, _train(_ExpSaved.apply))
    assert BackwardCFunction.apply is before and "apply" not in vars(_SingleLevelFunction)
    assert gc.isenabled()


def _adam_embedding(dtype, eps):
    def program():
        torch.manual_seed(0)
        emb = torch.nn.Embedding(10, 4).to(dtype)
        opt = torch.optim.Adam(emb.parameters(), lr=1e-3, eps=eps)
        for _ in range(2):
            loss = emb(torch.tensor([0, 1, 2])).float().sum()  # rows 3-9 get an exactly zero gradient
            opt.zero_grad()
            loss.backward()
            opt.step()
    return program


def test_nan_parameters_fp16_adam_default_eps():
    m = observed(NanParameterProbe, _adam_embedding(torch.float16, 1e-8))
    run = m["details"]["runs"]["2"]
    assert m["defect"] is True and run["nonfinite"] == 7 * 4 and run["first_bad_step"] == 1
    assert run["dtypes"] == ["float16"] and run["elements"] == 40


def test_nan_parameters_fp16_adam_eps_1e4_and_fp32_are_healthy():
    for dtype, eps in ((torch.float16, 1e-4), (torch.float32, 1e-8)):
        m = observed(NanParameterProbe, _adam_embedding(dtype, eps))
        assert m["defect"] is False and m["figure"] == 0
        assert m["details"]["runs"]["2"]["steps_total"] == 2


def test_nan_parameters_ignores_divergence_where_eps_is_not_the_cause():
    # a float32 SGD (no eps) at a huge learning rate turns its weights inf/NaN: not TGL305's defect
    def program():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=1e30)
        for _ in range(3):
            opt.zero_grad()
            (1e20 * model(torch.randn(8, 4))).pow(2).mean().backward()
            opt.step()
        assert not torch.isfinite(model.weight).all()

    m = observed(NanParameterProbe, program)
    assert m["defect"] is False and m["details"]["runs"]["2"]["elements"] == 0


def test_ce_floor_and_gradient_ratio_match_the_research():
    assert round(ce_floor(10), 3) == 1.461
    confident_wrong = torch.softmax(torch.tensor([[0.0, 12.0]]), dim=1)
    ratio = float(logit_gradient_ratio(confident_wrong, torch.tensor([0]))[0])
    assert ratio < 1e-3  # the research: 1.19e-4 / 1.414 for its sample


def _classify(with_softmax: bool):
    def program():
        import torch.nn.functional as F

        torch.manual_seed(0)
        logits = torch.randn(16, 10, requires_grad=True)
        y = torch.randint(0, 10, (16,))
        x = F.softmax(logits, dim=1) if with_softmax else logits
        torch.nn.CrossEntropyLoss()(x, y).backward()
    return program


def test_probability_input_softmax_into_cross_entropy():
    m = observed(ProbabilityInputProbe, _classify(True))
    run = m["details"]["runs"]["2"]
    assert m["defect"] is True and run["probability_calls"] == 1 and run["losses"] == ["cross_entropy"]
    assert round(run["floor"], 3) == 1.461 and 0 < run["ratio"] < 1


def test_probability_input_logits_are_healthy():
    m = observed(ProbabilityInputProbe, _classify(False))
    assert m["defect"] is False and m["details"]["runs"]["2"]["calls"] == 1


def test_probability_input_sigmoid_into_bce_with_logits():
    def program():
        z = torch.randn(32)
        torch.nn.functional.binary_cross_entropy_with_logits(torch.sigmoid(z), (z > 0).float())

    assert observed(ProbabilityInputProbe, program)["defect"] is True


def _log_of(kind: str):
    def program():
        import torch.nn.functional as F

        logits = torch.tensor([[0.0, 200.0, -200.0]], requires_grad=True)
        if kind == "softmax":
            (-torch.log(torch.gather(F.softmax(logits, dim=1), 1, torch.tensor([[2]])))).sum().backward()
        elif kind == "method":
            F.softmax(logits, dim=1).log().sum()
        elif kind == "log_softmax":
            (-torch.gather(F.log_softmax(logits, dim=1), 1, torch.tensor([[2]]))).sum().backward()
        else:  # the log of something else: a positive activation
            torch.log(F.softplus(logits)).sum()
    return program


def test_probability_input_log_of_a_softmax_output_and_its_underflow():
    m = observed(ProbabilityInputProbe, _log_of("softmax"))
    run = m["details"]["runs"]["2"]
    assert m["defect"] is True and run["losses"] == ["log"] and run["infinite"] == 1
    assert observed(ProbabilityInputProbe, _log_of("method"))["defect"] is True


def test_probability_input_log_softmax_and_other_logs_are_healthy():
    assert observed(ProbabilityInputProbe, _log_of("log_softmax"))["defect"] is False
    assert observed(ProbabilityInputProbe, _log_of("other"))["defect"] is False


def test_probability_input_restores_log():
    before = (torch.log, torch.Tensor.log)
    with ProbabilityInputProbe().observe("cpu", 1):
        assert torch.log is not before[0] and torch.Tensor.log is not before[1]
    assert (torch.log, torch.Tensor.log) == before
