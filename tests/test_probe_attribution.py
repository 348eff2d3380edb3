"""How a probe names the line that caused a defect (harness/probe_base.py), the probe registry, and the
attribution of the probes of TGL006, TGL007, TGL103, TGL104, TGL203, TGL303, TGL304 and TGL305."""

import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.harness import instrument  # noqa: E402
from torchgradlint.harness.probe_base import Measurement, Probe, merge_stacks  # noqa: E402
from torchgradlint.harness.probe_registry import all_probes  # noqa: E402
from torchgradlint.harness.probes_numerics import produced_by  # noqa: E402
from torchgradlint.harness.probes_structure import random_in_eval  # noqa: E402
from torchgradlint.harness.worker import measure  # noqa: E402
from test_probes_structure import TRAIN as STRUCTURE_TRAIN  # noqa: E402


class CountingProbe(Probe):
    """A toy probe: every ``hit()`` is a defect of TGL001 at the caller's line."""

    name = "toy"
    unit = "hits"

    def __init__(self):
        super().__init__()
        self.hits = 0

    def hit(self):
        self.hits += 1
        self.attribute("TGL001", "hit")

    def sample(self):
        return {"hits": self.hits}

    @classmethod
    def decide(cls, samples):
        s = samples[min(samples)]
        return Measurement(cls.name, float(s["hits"]), cls.unit, f"hits: {s['hits']}", "", s["hits"] > 0)


def test_attribute_charges_the_callers_line_and_judge_makes_findings():
    probe = CountingProbe()
    for _ in range(3):
        probe.hit(); line = sys._getframe().f_lineno  # noqa: E702 - the line the finding must name
    sample = probe.collect()
    assert sample["hits"] == 3 and len(sample["attributed"]) == 1
    m = CountingProbe.judge({1: sample})
    (f,) = m.findings
    assert f["code"] == "TGL001" and f["figure"] == 3.0 and f["display"] == "hit (3 hits)"
    # the toy probe lives in a user file (this one), so its own line comes first, then its caller's
    assert f["stack"][:2] == [[__file__, CountingProbe.hit.__code__.co_firstlineno + 2], [__file__, line]]
    assert CountingProbe.decide({1: sample}).findings == []  # decide alone makes none: judge adds them


def test_judge_without_a_defect_or_with_own_findings_adds_nothing():
    probe = CountingProbe()
    assert CountingProbe.judge({1: probe.collect()}).findings == []

    class Own(CountingProbe):
        @classmethod
        def decide(cls, samples):
            m = super().decide(samples)
            m.findings = [{"code": "TGL001", "stack": [], "figure": 1.0, "unit": "hits", "display": "own"}]
            return m

    probe = Own()
    probe.hit()
    assert [f["display"] for f in Own.judge({1: probe.collect()}).findings] == ["own"]


def test_sites_add_up_per_code_text_and_stack_and_the_record_can_be_updated():
    probe = CountingProbe()
    a = probe.attribute("TGL305", "nan", amount=0, stack=[("x.py", 3)], unit="elements")
    a["count"] = max(a["count"], 7)
    probe.attribute("TGL305", "nan", amount=0, stack=[("x.py", 3)], unit="elements")["count"] += 1
    probe.attribute("TGL305", "nan", stack=[("x.py", 4)])
    sites = probe.attributed()
    assert [(s["stack"], s["count"], s["unit"]) for s in sites] == [([["x.py", 3]], 8, "elements"),
                                                                   ([["x.py", 4]], 1.0, "hits")]


def test_merge_stacks_keeps_the_cause_first_without_repeats():
    assert merge_stacks([["a.py", 7]], [("a.py", 31), ("a.py", 7)], None) == [["a.py", 7], ["a.py", 31]]


def test_registry_finds_every_probe_module_and_no_probe_module_imports_another():
    names = set(all_probes())
    assert {"stale-gradients", "grad-mode", "retained-graph", "module-mode", "gradcheck-power", "ctx-tensors",
            "nan-parameters", "probability-input", "unused-graph", "eval-spread", "unoptimized-grads"} <= names
    code = ("import sys, torchgradlint.harness.probes_structure, torchgradlint.harness.probes_numerics; "
            "assert 'torchgradlint.harness.probes' not in sys.modules, 'a probe module imports probes.py'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, capture_output=True)


def test_discarded_grad_mode_switches_are_the_ones_built_and_never_used():
    instrument.install()
    torch.no_grad(); bare = sys._getframe().f_lineno  # noqa: E702
    with torch.no_grad():
        pass
    entered = sys._getframe().f_lineno - 2
    ctx = torch.inference_mode(); later = sys._getframe().f_lineno  # noqa: E702

    @torch.no_grad()
    def decorated():
        return None

    sites = set(instrument.discarded_grad_mode_sites())
    assert (__file__, bare) in sites and (__file__, later) in sites and (__file__, entered) not in sites
    with ctx:
        pass
    assert (__file__, later) not in set(instrument.discarded_grad_mode_sites())
    assert not any(path == __file__ and decorated.__code__.co_firstlineno - 1 == line
                   for path, line in instrument.discarded_grad_mode_sites())
    for key in [k for k in instrument.GRAD_MODE_SITES if k[0] == __file__]:  # this file is on later tests' stacks
        del instrument.GRAD_MODE_SITES[key]


def test_random_in_eval_reads_dropout_and_sdpa_arguments():
    F = torch.nn.functional
    x = torch.ones(2, 2)
    assert random_in_eval(torch.dropout, (x, 0.3, True), {})
    assert not random_in_eval(torch.dropout, (x, 0.3, False), {})
    assert random_in_eval(F.dropout, (x,), {"p": 0.2})  # training defaults to True
    assert not random_in_eval(F.dropout, (x,), {"p": 0.2, "training": False})
    assert not random_in_eval(F.dropout2d, (x, 0.0), {})
    assert random_in_eval(F.scaled_dot_product_attention, (x, x, x), {"dropout_p": 0.1})
    assert not random_in_eval(F.scaled_dot_product_attention, (x, x, x), {})
    assert not random_in_eval(torch.relu, (x,), {})


def test_produced_by_follows_views_and_copies_only():
    z = torch.randn(4, 3, requires_grad=True)
    assert produced_by(torch.sigmoid(z).reshape(-1).float().grad_fn, frozenset({"SigmoidBackward0"}))
    assert not produced_by((torch.sigmoid(z) * 2).grad_fn, frozenset({"SigmoidBackward0"}))
    assert not produced_by(None, frozenset({"SigmoidBackward0"}))


# -- each probe names the line, in a harness run -----------------------------------------------
TRAIN = "import torch.nn.functional as F\n" + STRUCTURE_TRAIN  # train(model, steps, params=None)


def measured(tmp_path, body: str, probe: str) -> tuple[dict, dict]:
    """The measurement and ``{marker: line}`` for each ``# at: marker`` comment of the program."""
    text = TRAIN + textwrap.dedent(body)
    # a new file name per program: grad-mode switches are noted per process, by file and line
    path = tmp_path / f"prog{len(list(tmp_path.glob('prog*.py')))}.py"
    path.write_text(text, encoding="utf-8")
    result = measure(path, probe, "cpu", 2)
    assert result["error"] is None, result["error"]
    marks = {line.split("# at: ")[1].strip(): i for i, line in enumerate(text.splitlines(), 1) if "# at: " in line}
    return result["measurement"], marks


def first_lines(m: dict) -> set:
    """``(code, line)`` of each finding's first frame in the measured program."""
    return {(f["code"], next(ln for p, ln in f["stack"] if "/prog" in p)) for f in m["findings"]}


def test_unoptimized_grads_tells_a_listed_layer_from_a_layer_built_in_forward(tmp_path):
    m, at = measured(tmp_path, """
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 4)
            self.hidden = [nn.Linear(4, 4)]  # at: list

        def forward(self, x):
            return nn.Linear(4, 2)(self.hidden[0](self.inp(x)))  # at: forward


    def main(device, steps):
        train(Net(), steps)
    """, "unoptimized-grads")
    assert m["defect"] and first_lines(m) == {("TGL006", at["list"]), ("TGL007", at["forward"])}
    assert sorted(f["figure"] for f in m["findings"]) == [2.0, 2.0]  # a weight and a bias each


def test_unoptimized_grads_ignores_left_out_modules_inputs_and_runs_without_a_step(tmp_path):
    m, _ = measured(tmp_path, """
    def main(device, steps):
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
        train(model, steps, params=model[1].parameters())  # fine-tuning the head only
        x = torch.randn(3, 4, requires_grad=True)  # an input gradient (saliency)
        model(x).sum().backward()
    """, "unoptimized-grads")
    assert not m["defect"] and m["findings"] == []
    assert m["details"]["runs"]["2"]["plain_leaves"] >= 2


def test_unused_graph_needs_a_switch_built_and_never_entered(tmp_path):
    body = """
    def main(device, steps):
        model = nn.Linear(4, 2)
        train(model, steps)
        {switch}
        for _ in range(steps):
            model(torch.randn(8, 4))  # at: forward
    """
    m, at = measured(tmp_path, body.format(switch="torch.inference_mode()  # at: switch"), "unused-graph")
    assert m["defect"] and m["figure"] == 2
    (f,) = m["findings"]
    # (this test file is on the stack too, with its own bare switch above: only the program's frames)
    assert [ln for p, ln in f["stack"] if "/prog" in p][:2] == [at["switch"], at["forward"]]
    m, _ = measured(tmp_path, body.format(switch="pass"), "unused-graph")
    assert not m["defect"] and m["details"]["runs"]["2"]["unused_any"] == 2  # listed, not this rule's defect


def test_eval_spread_names_the_dropout_call_and_ignores_other_variation(tmp_path):
    m, at = measured(tmp_path, """
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 16)

        def forward(self, x):
            return F.dropout(self.fc(x), 0.5)  # at: dropout


    class Fresh(nn.Module):
        def forward(self, x):
            return nn.Linear(4, 2)(x)


    def main(device, steps):
        train(Net(), steps)
        Fresh()(torch.randn(2, 4))
    """, "eval-spread")
    assert m["defect"] and first_lines(m) == {("TGL203", at["dropout"])}
    runs = m["details"]["runs"]["2"]
    assert set(runs["spreads"]) == {"Net"} and runs["other_spreads"]["Fresh"] > 0


def test_probability_input_names_the_loss_call_and_needs_a_sigmoid_for_bce(tmp_path):
    m, at = measured(tmp_path, """
    def main(device, steps):
        net = nn.Linear(4, 3)
        for _ in range(steps):
            probs = net(torch.randn(8, 4)).softmax(-1)
            F.cross_entropy(probs, torch.zeros(8, dtype=torch.long)).backward()  # at: ce
            logits = torch.rand(8, requires_grad=True) * 1.0  # logits that lie in [0, 1], not a sigmoid's
            F.binary_cross_entropy_with_logits(logits, torch.ones(8))
    """, "probability-input")
    assert m["defect"] and first_lines(m) == {("TGL303", at["ce"])}
    assert m["details"]["runs"]["2"]["losses"] == ["cross_entropy"]


def test_nan_parameters_names_where_the_optimizer_was_built(tmp_path):
    m, at = measured(tmp_path, """
    def main(device, steps):
        net = nn.Linear(4, 2).half()
        opt = torch.optim.Adam(net.parameters(), eps=1e-8)  # at: built
        for _ in range(steps):
            opt.zero_grad()
            (net(torch.randn(8, 4).half()).float().pow(2).mean() * 0).backward()
            opt.step()  # at: step
    """, "nan-parameters")
    assert m["defect"]
    (f,) = m["findings"]
    assert [ln for _, ln in f["stack"][:2]] == [at["built"], at["step"]]


def test_ctx_tensors_names_the_store_on_ctx(tmp_path):
    m, at = measured(tmp_path, """
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            out = x * x
            ctx.x = x
            ctx.out = out  # at: store
            return out

        @staticmethod
        def backward(ctx, g):
            return 2 * ctx.x * g


    def main(device, steps):
        w = nn.Parameter(torch.randn(4))
        for _ in range(steps):
            Square.apply(w).sum().backward()
    """, "ctx-tensors")
    assert m["defect"] and first_lines(m) == {("TGL104", at["store"])}


def test_gradcheck_power_names_the_gradcheck_call(tmp_path):
    m, at = measured(tmp_path, """
    def main(device, steps):
        x = torch.randn(3, requires_grad=True)
        torch.autograd.gradcheck(torch.sin, (x,), eps=1e-3, atol=1e-2, rtol=1e-2)  # at: check
    """, "gradcheck-power")
    assert m["defect"] and first_lines(m) == {("TGL304", at["check"])}
