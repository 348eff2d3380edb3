"""The structure probes (harness/probes_structure.py) on tiny defective and healthy programs."""

import textwrap

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.harness.probes_structure import (  # noqa: E402
    EvalSpreadProbe,
    UnoptimizedGradientProbe,
    UnusedGraphProbe,
)
from torchgradlint.harness.worker import measure  # noqa: E402

STEPS = 3

TRAIN = """
import torch
from torch import nn


def train(model, steps, params=None):
    opt = torch.optim.SGD(params if params is not None else model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
"""


def run(tmp_path, body: str, probe: str) -> dict:
    path = tmp_path / "prog.py"
    path.write_text(TRAIN + textwrap.dedent(body), encoding="utf-8")
    result = measure(path, probe, "cpu", STEPS)
    assert result["error"] is None, result["error"]
    return result["measurement"]


# -- unused-graph (TGL103) ---------------------------------------------------------------------
BARE = """
def main(device, steps):
    model = nn.Linear(4, 2)
    train(model, steps)
    model.eval()
    torch.no_grad()
    for _ in range(steps):
        model(torch.randn(8, 4))
"""


def test_unused_graph_counts_evaluation_forwards_that_record_a_graph(tmp_path):
    m = run(tmp_path, BARE, UnusedGraphProbe.name)
    assert m["defect"] is True
    assert m["figure"] == STEPS  # the evaluation forwards, not the trained ones
    assert m["display"] == f"forwards with an unused graph: {STEPS}/{2 * STEPS}"


def test_unused_graph_healthy_under_with(tmp_path):
    m = run(tmp_path, BARE.replace("    torch.no_grad()\n    for", "    with torch.no_grad():\n     for"),
            UnusedGraphProbe.name)
    assert m["defect"] is False and m["figure"] == 0


def test_unused_graph_counts_only_top_level_calls(tmp_path):
    m = run(tmp_path, """
def main(device, steps):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    train(model, steps)
""", UnusedGraphProbe.name)
    assert m["defect"] is False
    assert m["details"]["runs"][str(STEPS)]["forwards"] == STEPS


# -- eval-spread (TGL203) ----------------------------------------------------------------------
SPREAD = """
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 16)

    def forward(self, x):
        return F.dropout(self.fc(x), 0.5{training})


def main(device, steps):
    model = Net()
    train(model, steps)
    model.eval()
    with torch.no_grad():
        model(torch.randn(8, 4))
"""


def test_eval_spread_measures_functional_dropout_in_eval_mode(tmp_path):
    m = run(tmp_path, SPREAD.format(training=""), EvalSpreadProbe.name)
    assert m["defect"] is True
    assert m["figure"] > 0.1  # half the units of a 16-wide layer zeroed at random
    assert m["details"]["runs"][str(STEPS)]["spreads"].keys() == {"Net"}


def test_eval_spread_zero_when_dropout_follows_the_mode(tmp_path):
    m = run(tmp_path, SPREAD.format(training=", training=self.training"), EvalSpreadProbe.name)
    assert m["defect"] is False and m["figure"] == 0.0


def test_eval_spread_restores_the_module_mode(tmp_path):
    probe = EvalSpreadProbe()
    net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5))
    with probe.observe("cpu", 1):
        net(torch.randn(3, 2))
    assert net.training
    s = probe.sample()
    assert net.training and s["max_spread"] == 0.0


def test_eval_spread_repeats_under_the_autocast_of_the_last_call():
    # the last call ran in a bfloat16 autocast region: outside it the bfloat16 input meets float32 weights
    probe = EvalSpreadProbe()
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with probe.observe("cpu", 1):
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            net(torch.randn(3, 4).to(torch.bfloat16))
    s = probe.sample()
    assert s["rerun_failed"] == [] and s["spreads"] == {} and s["other_spreads"] == {"Sequential": 0.0}


def test_eval_spread_leaves_a_model_whose_rerun_raises_unjudged():
    class OneShot(torch.nn.Module):
        calls = 0

        def forward(self, x):
            OneShot.calls += 1
            if OneShot.calls > 1:
                raise ValueError("a generator already consumed")
            return torch.nn.functional.dropout(x, 0.5)

    probe = EvalSpreadProbe()
    with probe.observe("cpu", 1):
        OneShot()(torch.randn(3, 4))
    s = probe.sample()
    assert s["rerun_failed"] == ["OneShot"] and s["max_spread"] == 0.0


# -- unoptimized-grads (TGL006, TGL007) --------------------------------------------------------
LISTED = """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.hidden = {hidden}

    def forward(self, x):
        return self.hidden[0](self.inp(x))


def main(device, steps):
    train(Net(), steps)
"""


def test_unoptimized_grads_finds_layers_kept_in_a_list(tmp_path):
    m = run(tmp_path, LISTED.format(hidden="[nn.Linear(4, 2)]"), UnoptimizedGradientProbe.name)
    assert m["defect"] is True
    assert m["figure"] == 2  # the listed layer's weight and bias
    assert m["details"]["runs"][str(STEPS)]["unoptimized_elements"] == 4 * 2 + 2


def test_unoptimized_grads_healthy_with_module_list(tmp_path):
    m = run(tmp_path, LISTED.format(hidden="nn.ModuleList([nn.Linear(4, 2)])"), UnoptimizedGradientProbe.name)
    assert m["defect"] is False and m["figure"] == 0
    assert m["details"]["runs"][str(STEPS)]["graded_leaves"] == 4


def test_unoptimized_grads_finds_layers_built_in_forward(tmp_path):
    m = run(tmp_path, """
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 4)

    def forward(self, x):
        return nn.Linear(4, 2)(self.inp(x))


def main(device, steps):
    train(Net(), steps)
""", UnoptimizedGradientProbe.name)
    assert m["defect"] is True and m["figure"] == 2  # a new weight and bias in every backward
