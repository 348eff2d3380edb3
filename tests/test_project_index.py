"""The project index: names a file imports from its own project are resolved
(``torchgradlint check`` on small projects under ``tmp_path``)."""

import io
import sys
import textwrap

import pytest

import torchgradlint.project_index as project_index
from torchgradlint.cli import main

pytestmark = pytest.mark.usefixtures("isolated_cwd")  # tests/conftest.py

# A training loop, then an evaluation under no_grad without ``model.eval()``:
# TGL201 when ``Net`` may hold dropout or batch norm.
TRAIN = """\
import torch
{imports}

model = {ctor}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        val = model(x)
"""

MODE_FREE = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.fc(x))
"""

WITH_DROPOUT = MODE_FREE.replace("self.act = nn.ReLU()", "self.act = nn.Dropout(0.5)")

# A decorator of the project that runs the function under inference mode,
# named so that its name says nothing; and one that just calls it.
DECORATORS = """\
import functools

import torch


def evaluation(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with torch.inference_mode():
            return fn(*args, **kwargs)
    return wrapper


def timed(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper
"""

FIT = """\
import torch
from utils import {name}


@{name}
def fit(model, loader, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
"""


def write(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def check(capsys, *argv):
    rc = main(["check", "--no-cache", "--select", "TGL002,TGL201", *argv])
    out, err = capsys.readouterr()
    return rc, out


def codes(out):
    return sorted({line.split(": ")[1].split()[0] for line in out.splitlines() if ": TGL" in line})


def test_a_project_class_without_dropout_or_batch_norm_silences_tgl201(tmp_path, capsys):
    write(tmp_path, {"model.py": MODE_FREE, "main.py": TRAIN.format(imports="from model import Net", ctor="Net()")})
    assert check(capsys, "main.py") == (0, "")
    rc, out = check(capsys, "--no-project-index", "main.py")
    assert rc == 1 and codes(out) == ["TGL201"]


def test_a_project_class_with_dropout_still_fires(tmp_path, capsys):
    write(tmp_path, {"model.py": WITH_DROPOUT, "main.py": TRAIN.format(imports="from model import Net",
                                                                         ctor="Net()")})
    rc, out = check(capsys, "main.py")
    assert rc == 1 and "main.py:12:15: TGL201" in out


@pytest.mark.parametrize("model_py, expect", [(MODE_FREE, (0, [])), (WITH_DROPOUT, (1, ["TGL201"]))])
def test_a_class_from_a_star_import_of_the_project_is_looked_up(tmp_path, capsys, model_py, expect):
    # jmichaux/dqn-pytorch: ``from models import *`` then ``policy_net = DQN(n_actions=4)``
    write(tmp_path, {"model.py": model_py, "main.py": TRAIN.format(imports="from model import *", ctor="Net()")})
    rc, out = check(capsys, "main.py")
    assert (rc, codes(out)) == expect


SCRIPT_MODULE = MODE_FREE.replace("import torch.nn as nn", "from torch import jit, nn").replace(
    "class Net(nn.Module)", "class Net(jit.ScriptModule)")


@pytest.mark.parametrize("layer, expect", [("nn.ReLU()", (0, [])), ("nn.Dropout(0.5)", (1, ["TGL201"]))])
def test_a_project_script_module_is_judged_by_its_layers(tmp_path, capsys, layer, expect):
    # Kaixhin/PlaNet: models derive from torch.jit.ScriptModule (an nn.Module)
    write(tmp_path, {"model.py": SCRIPT_MODULE.replace("nn.ReLU()", layer),
                     "main.py": TRAIN.format(imports="from model import Net", ctor="Net()")})
    rc, out = check(capsys, "main.py")
    assert (rc, codes(out)) == expect


def test_a_base_class_in_a_third_file_decides(tmp_path, capsys):
    base = "import torch.nn as nn\n\n\nclass Base(nn.Module):\n    def __init__(self):\n        super().__init__()\n" \
           "        self.norm = nn.{layer}(4)\n"
    net = "from base import Base\n\n\nclass Net(Base):\n    pass\n"
    write(tmp_path, {"base.py": base.format(layer="LayerNorm"), "model.py": net,
                     "main.py": TRAIN.format(imports="from model import Net", ctor="Net()")})
    assert check(capsys, "main.py")[0] == 0
    (tmp_path / "base.py").write_text(base.format(layer="BatchNorm1d"))
    assert codes(check(capsys, "main.py")[1]) == ["TGL201"]


@pytest.mark.parametrize("imports, ctor", [
    ("from .models import Net", "Net()"),
    ("from . import models", "models.Net()"),
    ("from ..pkg.models import Net", "Net()"),
    ("from pkg.models import Net", "Net()"),
    ("import pkg.models", "pkg.models.Net()"),
])
def test_imports_from_a_package_resolve(tmp_path, capsys, imports, ctor):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    write(tmp_path, {"pkg/__init__.py": "", "pkg/models.py": MODE_FREE,
                     "pkg/train.py": TRAIN.format(imports=imports, ctor=ctor)})
    assert check(capsys, "pkg/train.py") == (0, "")
    assert codes(check(capsys, "--no-project-index", "pkg/train.py")[1]) == ["TGL201"]


def test_a_re_export_in_a_package_init_is_followed(tmp_path, capsys):
    write(tmp_path, {"nets/__init__.py": "from .model import Net\n", "nets/model.py": WITH_DROPOUT,
                     "main.py": TRAIN.format(imports="from nets import Net", ctor="Net()")})
    assert codes(check(capsys, "main.py")[1]) == ["TGL201"]
    (tmp_path / "nets" / "model.py").write_text(MODE_FREE)
    assert check(capsys, "main.py") == (0, "")


def test_import_module_then_attribute(tmp_path, capsys):
    write(tmp_path, {"utils.py": MODE_FREE, "main.py": TRAIN.format(imports="import utils", ctor="utils.Net()")})
    assert check(capsys, "main.py") == (0, "")


PARTS = """\
import torch.nn as nn


class Glimpse(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.act = {layer}

    def forward(self, x):
        return self.act(self.fc(x))
"""

WHOLE = """\
import torch.nn as nn

import parts


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.glimpse = parts.Glimpse()

    def forward(self, x):
        return self.glimpse(x)
"""


@pytest.mark.parametrize("layer, expect", [("nn.ReLU()", (0, [])), ("nn.Dropout(0.5)", (1, ["TGL201"]))])
def test_a_class_built_from_a_module_imported_whole(tmp_path, capsys, layer, expect):
    """kevinzakka's recurrent-visual-attention: ``import modules`` then ``modules.GlimpseNetwork(...)``
    in the model's file; the model is judged by the classes it takes from that module."""
    write(tmp_path, {"parts.py": PARTS.format(layer=layer), "model.py": WHOLE,
                     "main.py": TRAIN.format(imports="from model import Net", ctor="Net()")})
    rc, out = check(capsys, "main.py")
    assert (rc, codes(out)) == expect


def test_unresolvable_names_stay_unknown(tmp_path, capsys):
    write(tmp_path, {"main.py": TRAIN.format(imports="from models import Net", ctor="Net()"),
                     "other.py": MODE_FREE})
    rc, out = check(capsys, "main.py")
    assert rc == 1 and codes(out) == ["TGL201"]
    # a library installed elsewhere (not a file of the project) is not resolved either
    write(tmp_path, {"main.py": TRAIN.format(imports="from torchvision.models import resnet18",
                                             ctor="resnet18()")})
    assert codes(check(capsys, "main.py")[1]) == ["TGL201"]


def test_a_project_decorator_that_wraps_inference_mode_disables_grad(tmp_path, capsys):
    write(tmp_path, {"utils.py": DECORATORS, "main.py": FIT.format(name="evaluation"),
                     "timed.py": FIT.format(name="timed")})
    rc, out = check(capsys, "main.py", "timed.py")
    assert rc == 1
    assert "main.py:10:9: TGL002" in out and "@utils.evaluation" in out
    assert "timed.py" not in out  # a decorator that just calls the function changes nothing
    # without the index the decorator is foreign: grad mode unknown, nothing reported
    assert check(capsys, "--no-project-index", "main.py", "timed.py") == (0, "")
    # TGL002 alone: the prefilter would skip the file whole (no grad-mode API spelled in it)
    rc = main(["check", "--no-cache", "--select", "TGL002", "main.py", "timed.py"])
    out = capsys.readouterr().out
    assert rc == 1 and "main.py:10:9: TGL002" in out and "timed.py" not in out


def test_project_index_false_in_the_config_turns_it_off(tmp_path, capsys):
    write(tmp_path, {"model.py": MODE_FREE, "main.py": TRAIN.format(imports="from model import Net", ctor="Net()")})
    (tmp_path / "pyproject.toml").write_text("[tool.torchgradlint]\nproject-index = false\n")
    assert codes(check(capsys, "main.py")[1]) == ["TGL201"]
    write(tmp_path, {"bad/pyproject.toml": "[tool.torchgradlint]\nproject-index = 1\n", "bad/main.py": "import torch\n"})
    rc = main(["check", "bad/main.py"])
    assert rc == 2 and "project-index" in capsys.readouterr().err


def test_standard_input_is_linted_alone(tmp_path, capsys, monkeypatch):
    write(tmp_path, {"model.py": MODE_FREE})
    text = TRAIN.format(imports="from model import Net", ctor="Net()")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    rc, out = check(capsys, "-", "--stdin-filename", "main.py")
    assert rc == 1 and codes(out) == ["TGL201"]


@pytest.fixture
def summarised(tmp_path, monkeypatch):
    """Logs, one line per call, the files the index parses and summarises
    (worker processes are forked from this one and append to the same file)."""
    log = tmp_path.parent / f"{tmp_path.name}-summarised.log"
    log.write_text("")
    real = project_index.summarise

    def logged(source, path):
        with open(log, "a") as fh:
            fh.write(path.rsplit("/", 1)[-1] + "\n")
        return real(source, path)

    monkeypatch.setattr(project_index, "summarise", logged)
    return lambda: log.read_text().split()


def cached(capsys, *argv):
    rc = main(["check", "--cache-dir", ".cache", "--select", "TGL201", *argv])
    out, _ = capsys.readouterr()
    return rc, out


def test_the_cache_keeps_summaries_and_re_reads_only_changed_files(tmp_path, capsys, summarised):
    write(tmp_path, {"model.py": MODE_FREE, "main.py": TRAIN.format(imports="from model import Net", ctor="Net()")})
    assert cached(capsys, "main.py") == (0, "")
    assert summarised() == ["model.py"]
    # main.py edited, model.py not: main.py is linted again, model.py's summary comes from the cache
    with open(tmp_path / "main.py", "a") as fh:
        fh.write("print(val)\n")
    assert cached(capsys, "main.py") == (0, "")
    assert summarised() == ["model.py"]
    # model.py gains a dropout: main.py's cached result rests on it, so both are read again
    (tmp_path / "model.py").write_text(WITH_DROPOUT)
    rc, out = cached(capsys, "main.py")
    assert rc == 1 and codes(out) == ["TGL201"]
    assert summarised() == ["model.py", "model.py"]
    assert cached(capsys, "main.py")[0] == 1  # and the new result is cached as it is
    assert summarised() == ["model.py", "model.py"]


def test_the_index_and_the_plain_run_do_not_share_cached_results(tmp_path, capsys):
    write(tmp_path, {"model.py": MODE_FREE, "main.py": TRAIN.format(imports="from model import Net", ctor="Net()")})
    assert cached(capsys, "main.py")[0] == 0
    assert cached(capsys, "--no-project-index", "main.py")[0] == 1
    assert cached(capsys, "main.py")[0] == 0


def test_limits_leave_names_unknown(tmp_path):
    write(tmp_path, {"model.py": MODE_FREE, "main.py": "from model import Net\n"})
    importer = tmp_path / "main.py"
    small = project_index.ProjectIndex(tmp_path, max_file_bytes=10)
    assert small.resolve("model.Net", importer) is None
    none = project_index.ProjectIndex(tmp_path, max_files=0)
    assert none.resolve("model.Net", importer) is None
    index = project_index.ProjectIndex(tmp_path)
    found = index.resolve("model.Net", importer)
    assert found == (tmp_path / "model.py", "Net")
    assert index.verdict(*found, used := {}) is False and list(used) == [str(tmp_path / "model.py")]


def test_the_root_is_the_nearest_marked_folder(tmp_path):
    (tmp_path / "repo" / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "repo" / "setup.cfg").write_text("")
    f = tmp_path / "repo" / "src" / "pkg" / "m.py"
    assert project_index.find_root(f) == tmp_path / "repo"
    loose = tmp_path / "loose" / "a"
    loose.mkdir(parents=True)
    assert project_index.find_root(loose / "m.py", tmp_path / "loose") == tmp_path / "loose"
    assert project_index.find_root(loose / "m.py", tmp_path / "elsewhere") is None


def test_a_decorator_the_outline_decides_needs_no_full_summary(tmp_path, capsys, summarised):
    """``timed`` spells no grad-mode API: its effect comes from Python's
    ``ast`` (an outline); ``evaluation`` spells one, so its file gets the
    full LibCST summary, once."""
    write(tmp_path, {"utils.py": DECORATORS, "main.py": FIT.format(name="evaluation"),
                     "timed.py": FIT.format(name="timed")})
    assert main(["check", "--cache-dir", ".cache", "--select", "TGL002", "timed.py"]) == 0
    assert summarised() == []
    assert main(["check", "--cache-dir", ".cache", "--select", "TGL002", "main.py"]) == 1
    assert "main.py:10:9: TGL002" in capsys.readouterr().out
    assert summarised() == ["utils.py"]
    (tmp_path / "main.py").write_text(FIT.format(name="evaluation") + "\n# edited\n")
    assert main(["check", "--cache-dir", ".cache", "--select", "TGL002", "main.py"]) == 1
    assert summarised() == ["utils.py"]  # the upgraded summary was saved with the cache


# Shapes where an outline could drift from the full summary: one-line suites (not looked into),
# handlers, elif/else, try/else/finally, function-level imports, aliases by assignment (plain,
# parallel, in a loop, shadowing an import), star imports, grad-mode names in comments before,
# inside and after a definition, a decorated class, async functions.
TRICKY = """\
import torch
import torch.nn as nn
import os.path
from a.b import c as d, e
from . import sibling
from .pkg.mod import Thing as Other
from ..up import *
if TYPE_CHECKING: from .typing_only import Hidden
try:
    from .fast import impl
except ImportError: from .slow import impl2
except OSError:
    from .other import impl3
else:
    from .never import skipped
finally:
    from .nor import this
if A:
    from .x import one
elif B:
    from .y import two
else:
    from .z import three

nn2 = torch.nn
F, opt = torch.nn.functional, torch.optim
e = torch.autograd
for _ in range(1):
    G = nn.functional
gm = torch.autograd.grad_mode.no_grad


def helper():
    from q.r import inner
    return inner


# wraps torch.no_grad: the comment belongs to the next definition
@functools.wraps
def wrapped(fn):
    return fn


def after():
    pass
    # set_grad_enabled in a trailing comment


async def runner():
    with torch.inference_mode():
        pass


@dataclass
class Cfg(nn.Module):
    x: int = 1

if A:
    def cond():
        pass
try:
    class Tried:
        pass
except Exception:
    def fallback():
        with torch.enable_grad():
            pass
"""


def _agrees(source):
    """Whether the outline of ``source`` names the same symbols and imports as
    its full summary and every decided effect matches."""
    out, full = project_index.outline(source), project_index.summarise(source, "m.py")
    assert out is not None and full is not None
    assert set(out["symbols"]) == set(full["symbols"])
    assert out["imports"] == full["imports"]
    for name, (_, _, effect, outputs, kinds, meter) in out["symbols"].items():
        assert effect in (project_index.UNDECIDED, full["symbols"][name][2]), name
        assert outputs in (project_index.UNDECIDED, full["symbols"][name][3]), name
        assert kinds is None  # the verdicts (and their layer kinds) come from the full summary only
        assert meter == full["symbols"][name][5], name  # decided by the outline's own ``ast`` test
    return out


def test_the_outline_agrees_with_the_full_summary_on_tricky_shapes():
    out = _agrees(TRICKY)
    effects = {name: s[2] for name, s in out["symbols"].items()}
    assert effects["Cfg"] is None and effects["cond"] is None and effects["Tried"] is None
    # the comment between two definitions may belong to either: both stay undecided
    assert effects["helper"] == effects["wrapped"] == project_index.UNDECIDED
    assert effects["after"] == effects["runner"] == effects["fallback"] == project_index.UNDECIDED
    assert out["imports"]["Other"] == ".pkg.mod.Thing" and out["imports"]["three"] == ".z.three"
    assert "Hidden" not in out["imports"] and "impl2" not in out["imports"]  # one-line suites: not looked into
    assert out["imports"]["e"] == "torch.autograd"  # the assignment after the import wins


def test_the_outline_agrees_with_the_full_summary_on_the_fixtures():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    files = sorted((root / "fixtures").rglob("*.py")) + sorted((root / "src").rglob("*.py"))
    assert len(files) > 100
    for f in files:
        _agrees(f.read_text(encoding="utf-8"))


def test_an_outline_python_rejects_falls_back_to_the_full_summary(tmp_path):
    # tabs and spaces mixed in a way Python's tokenizer rejects and LibCST accepts
    text = "import torch\nclass Net:\n    def f(self):\n\tpass\n"
    assert project_index.outline(text) is None
    (tmp_path / "m.py").write_text(text)
    index = project_index.ProjectIndex(tmp_path)
    entry = index.entry(tmp_path / "m.py")
    assert entry is not None and entry[3] == project_index.summarise(text, str(tmp_path / "m.py"))


def test_an_outline_imports_no_libcst(tmp_path):
    """A decorator the outline decides costs the flake8 plugin no LibCST import."""
    import subprocess

    write(tmp_path, {"utils.py": DECORATORS, "timed.py": FIT.format(name="timed"),
                     "main.py": FIT.format(name="evaluation")})

    def probe(name):
        code = ("import sys\nfrom pathlib import Path\nfrom torchgradlint.project_index import ProjectIndex\n"
                f"root = Path({str(tmp_path)!r})\nindex = ProjectIndex(root)\n"
                f"source = (root / {name!r}).read_text()\n"
                f"print(repr(index.prefilter_hint(str(root / {name!r}), source, {{}})), 'libcst' in sys.modules)\n")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()

    assert probe("timed.py") == ["''", "False"]
    # the decorator that spells inference_mode needs the full summary (and the probe sees the import)
    assert probe("main.py") == ["'", "inference_mode'", "True"]


# -- TGL303 across files: a model class of the project whose forward returns probabilities ----------
NETWORKS = """\
import torch.nn as nn
import torch.nn.functional as F


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=-1)


class ActorCritic(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.v = nn.Linear(4, 1)

    def forward(self, x):
        return F.softmax(self.fc(x), dim=-1), self.v(x)


class LogPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return F.log_softmax(self.fc(x), dim=-1)
"""

LOGITS = """\
import torch.nn as nn


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)
"""

# An agent that takes the log of an imported network's output; no softmax in its own text.
AGENT = """\
import torch
{imports}


class Agent:
    def __init__(self):
        self.policy = {ctor}

    def loss(self, x, a, ret):
        probs = self.policy(x)
        return -(torch.log(probs.gather(1, a)) * ret).mean()
"""

TRAIN_CE = """\
import torch
import torch.nn as nn
{imports}

model = {ctor}
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
"""


def check303(capsys, *argv):
    rc = main(["check", "--no-cache", "--select", "TGL303", "--output-format", "concise", *argv])
    out, _ = capsys.readouterr()
    return rc, [line.split(": ", 1)[0] + " " + line.split(": ", 1)[1].split(" ", 1)[0]
                for line in out.splitlines() if ": TGL" in line]


@pytest.mark.parametrize("imports, ctor", [
    ("from networks import Policy", "Policy()"),
    ("from nets.networks import Policy", "Policy()"),
    ("import networks", "networks.Policy()"),
])
def test_log_of_a_project_softmax_network_is_reported(tmp_path, capsys, imports, ctor):
    files = {"networks.py": NETWORKS, "nets/networks.py": NETWORKS, "nets/__init__.py": "",
             "agent.py": AGENT.format(imports=imports, ctor=ctor)}
    write(tmp_path, files)
    assert check303(capsys, "agent.py") == (1, ["agent.py:11:18 TGL303"])
    # linted alone, the agent shows no softmax: silent (and skipped by the prefilter)
    assert check303(capsys, "--no-project-index", "agent.py") == (0, [])


def test_a_relative_import_of_a_softmax_network_is_followed(tmp_path, capsys):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/networks.py": NETWORKS,
                     "pkg/agent.py": AGENT.format(imports="from .networks import Policy", ctor="Policy()")})
    assert check303(capsys, "pkg/agent.py") == (1, ["pkg/agent.py:11:18 TGL303"])


def test_cross_entropy_on_a_project_softmax_network_is_reported(tmp_path, capsys):
    write(tmp_path, {"networks.py": NETWORKS,
                     "train.py": TRAIN_CE.format(imports="from networks import Policy", ctor="Policy()")})
    rc, found = check303(capsys, "train.py")
    assert (rc, found) == (1, ["train.py:10:12 TGL303"])


def test_an_element_of_a_project_networks_tuple_is_followed(tmp_path, capsys):
    agent = AGENT.format(imports="from networks import ActorCritic", ctor="ActorCritic()").replace(
        "probs = self.policy(x)", "probs, value = self.policy(x)")
    write(tmp_path, {"networks.py": NETWORKS, "agent.py": agent})
    assert check303(capsys, "agent.py") == (1, ["agent.py:11:18 TGL303"])
    # the value head (element 1) is no probability
    write(tmp_path, {"agent.py": agent.replace("probs, value = self.policy(x)", "value, probs = self.policy(x)")})
    assert check303(capsys, "agent.py") == (0, [])


@pytest.mark.parametrize("files, imports, ctor", [
    ({"networks.py": NETWORKS}, "from networks import LogPolicy", "LogPolicy()"),  # log-probabilities
    ({"classifier.py": LOGITS}, "from classifier import Classifier", "Classifier()"),  # logits
    ({}, "from missing import Policy", "Policy()"),  # not a project file
])
def test_project_networks_without_probabilities_stay_silent(tmp_path, capsys, files, imports, ctor):
    write(tmp_path, {**files, "agent.py": AGENT.format(imports=imports, ctor=ctor),
                     "train.py": TRAIN_CE.format(imports=imports, ctor=ctor)})
    assert check303(capsys, "agent.py", "train.py") == (0, [])


def test_a_network_file_without_softmax_is_never_parsed(tmp_path, capsys, summarised):
    """The outline of a file that spells no softmax or sigmoid says its classes return no
    probabilities: the index makes no full (LibCST) summary of it."""
    write(tmp_path, {"classifier.py": LOGITS,
                     "train.py": TRAIN_CE.format(imports="from classifier import Classifier", ctor="Classifier()")})
    assert check303(capsys, "train.py") == (0, [])
    assert summarised() == []
    write(tmp_path, {"networks.py": NETWORKS,
                     "train.py": TRAIN_CE.format(imports="from networks import Policy", ctor="Policy()")})
    assert check303(capsys, "train.py")[0] == 1
    assert summarised() == ["networks.py"]


def test_summaries_record_what_a_forward_returns():
    summary = project_index.summarise(NETWORKS, "networks.py")
    assert summary is not None
    outputs = {name: s[3] for name, s in summary["symbols"].items()}
    assert outputs == {"Policy": ["softmax", []], "ActorCritic": [None, ["softmax", None]], "LogPolicy": None}
    outline = project_index.outline(NETWORKS)
    assert {s[3] for s in outline["symbols"].values()} == {project_index.UNDECIDED}
    assert {s[3] for s in project_index.outline(LOGITS)["symbols"].values()} == {None}


def test_the_flake8_plugin_follows_project_softmax_networks(tmp_path):
    import subprocess

    write(tmp_path, {"networks.py": NETWORKS, "agent.py": AGENT.format(imports="from networks import Policy",
                                                                         ctor="Policy()")})
    (tmp_path / ".git").mkdir()
    out = subprocess.run([sys.executable, "-m", "flake8", "--isolated", "--select=TGL", "agent.py"],
                         capture_output=True, text=True, cwd=tmp_path).stdout
    assert [line.split(" ", 2)[:2] for line in out.splitlines()] == [["agent.py:11:18:", "TGL303"]]


_GENERATOR = """
import torch.nn as nn
from blocks import up


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.ConvTranspose2d(8, 16, 4), up(16), nn.ConvTranspose2d(16, 3, 4), nn.Tanh())

    def forward(self, z):
        return self.main(z)
"""
_BLOCKS = """
import torch.nn as nn


def up(channels):
    return nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(True){extra})
"""
_DCGAN = """
import torch
from models import Generator

net_g = Generator()
opt_g = torch.optim.Adam(net_g.parameters())
fixed_noise = torch.randn(64, 8, 1, 1)
for epoch in range(5):
    for real in loader:
        opt_g.zero_grad()
        loss = -net_g(torch.randn(64, 8, 1, 1)).mean()
        loss.backward()
        opt_g.step()
    with torch.no_grad():
        fake = net_g(fixed_noise).detach().cpu()
    save_image(fake, f"{epoch}.png")
"""


@pytest.mark.parametrize("extra, expect", [("", (0, [])), (", nn.Dropout(0.2)", (1, ["TGL201"]))])
def test_a_project_generator_with_batch_norm_only_is_sampled_on_noise_in_its_training_loop(
        tmp_path, capsys, extra, expect):
    # zhangxiann/PyTorch_Practice lesson8: DCGAN's fixed-noise images, its Generator in another file;
    # batch norm is its only mode-dependent layer two files away (dropout would make the samples worse)
    write(tmp_path, {"models.py": _GENERATOR, "blocks.py": _BLOCKS.format(extra=extra), "train.py": _DCGAN})
    rc, out = check(capsys, "train.py")
    assert (rc, codes(out)) == expect
    rc, out = check(capsys, "--no-project-index", "train.py")
    assert (rc, codes(out)) == (1, ["TGL201"])  # without the index the generator is not visible


# Two classes of a project's ``meter.py``: one keeps only the latest value, one adds every value
# into a running sum (thuml's Transfer-Learning-Library has both, ``Meter`` and ``AverageMeter``).
METERS = """\
class Meter(object):
    def __init__(self, name):
        self.name = name
        self.val = 0

    def update(self, val):
        self.val = val


class LossTracker:
    def __init__(self):
        self.total, self.n = 0, 0

    def update(self, value, n=1):
        self.total += value * n
        self.n += n
"""

TRAIN_WITH_METER = """\
import torch
from meter import {name}


def train(model, loader, optimizer, criterion):
    meter = {name}()
    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        meter.update(loss)
"""


@pytest.mark.parametrize("name, expect", [("LossTracker", (1, ["TGL101"])), ("Meter", (0, []))])
def test_a_project_meter_class_is_judged_by_its_update(tmp_path, capsys, name, expect):
    write(tmp_path, {"meter.py": METERS, "main.py": TRAIN_WITH_METER.format(name=name)})
    rc = main(["check", "--no-cache", "--select", "TGL101", "main.py"])
    out, _ = capsys.readouterr()
    assert (rc, codes(out)) == expect


def test_a_name_defined_twice_is_outlined_as_its_later_definition():
    # a script that redefines a class (a notebook exported to .py) keeps six fields per symbol
    source = METERS + "\n\nclass LossTracker:\n    def update(self, value):\n        self.last = value\n"
    out = _agrees(source)
    assert out["symbols"]["LossTracker"][5] is False and out["symbols"]["Meter"][5] is False
    assert project_index.outline(METERS)["symbols"]["LossTracker"][5] is True


CONFIGURABLE_BLOCK = """\
import torch.nn as nn


class ResidualBlock(nn.Module):
    def __init__(self, dim, resample=None):
        super().__init__()
        if resample == 'down':
            self.norm = nn.LayerNorm(dim)
        elif resample == 'up':
            self.norm = nn.BatchNorm1d(dim)
        else:
            raise ValueError(resample)

    def forward(self, x):
        return self.norm(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.rb1 = ResidualBlock(4, resample='{which}')
        self.rb2 = ResidualBlock(4, '{which}')

    def forward(self, x):
        return self.rb2(self.rb1(x))
"""


@pytest.mark.parametrize("which, expect", [("down", (0, [])), ("up", (1, ["TGL201"]))])
def test_a_project_class_is_judged_by_the_literal_arguments_of_its_blocks(tmp_path, capsys, which, expect):
    # improved-wgan-pytorch: the critic's blocks take resample='down' (layer norm), the generator's 'up'
    write(tmp_path, {"model.py": CONFIGURABLE_BLOCK.replace("{which}", which),
                     "main.py": TRAIN.format(imports="from model import *", ctor="Net()")})
    rc, out = check(capsys, "main.py")
    assert (rc, codes(out)) == expect
