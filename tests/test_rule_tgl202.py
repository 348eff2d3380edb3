"""TGL202 train-not-restored on short snippets the fixtures do not cover."""

import pytest

from rule_snippets import finding_lines
from torchgradlint.engine import lint_source
from torchgradlint.rules.train_not_restored import TrainNotRestored

HEAD = """\
import torch
from torch import nn
model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
"""


def lines(src: str) -> list[int]:
    return finding_lines(TrainNotRestored, src)


def loop(before: str = "", top: str = "", after: str = "    model.eval()\n    val = model(x_val)\n") -> str:
    return (HEAD + before + "for epoch in range(3):\n" + top +
            "    for x, y in loader:\n        optimizer.zero_grad()\n        loss_fn(model(x), y).backward()\n"
            "        optimizer.step()\n" + after)


def test_eval_in_loop_with_train_only_before_the_loop():
    assert lines(loop(before="model.train()\n")) == [10]


def test_train_false_counts_as_eval():
    assert lines(loop(after="    model.train(False)\n")) == [9]
    assert lines(loop(after="    model.train(mode=False)\n")) == [9]


@pytest.mark.parametrize("top", ["    model.train()\n", "    model.train(True)\n", "    model.train(mode=True)\n",
                                 "    model.to(device).train()\n", "    model.train(epoch > 0)\n"])
def test_train_at_loop_top_is_silent(top):
    assert lines(loop(top=top)) == []


def test_switch_back_after_evaluating_is_silent():
    assert lines(loop(after="    model.eval()\n    val = model(x_val)\n    model.train()\n")) == []


def test_eval_after_the_loop_is_silent():
    assert lines(loop(after="") + "model.eval()\n") == []


def test_eval_on_one_branch_of_a_phase_switch_is_silent():
    assert lines(HEAD + """\
for epoch in range(3):
    for phase in ("train", "val"):
        if phase == "train":
            model.train()
        else:
            model.eval()
        for x, y in loaders[phase]:
            loss = loss_fn(model(x), y)
            if phase == "train":
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
""") == []
    assert lines(HEAD + """\
for epoch in range(3):
    for phase in ("train", "val"):
        model.train() if phase == "train" else model.eval()
        for x, y in loaders[phase]:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
""") == []


def test_eval_before_training_in_the_same_iteration_is_deliberate():
    # every iteration chooses eval mode for its own training: frozen statistics on purpose
    assert lines(loop(top="    model.eval()\n", after="")) == []


def test_fresh_instance_every_iteration_is_silent():
    assert lines("""\
        import torch
        from torch import nn
        for cls in classes:
            model = cls(config)
            model.eval()
            loss_fn(model(x), y).backward()
            optimizer.step()
    """) == []


def test_eval_of_a_copy_is_silent():
    assert lines(loop(after="    ema = copy.deepcopy(model)\n    ema.eval()\n    val = ema(x_val)\n")) == []


def test_eval_in_helper_and_train_in_helper():
    src = HEAD + """\
def validate(net, data):
    net.eval()
    with torch.no_grad():
        return [net(x) for x in data]
def train_epoch(net, data):
    for x, y in data:
        optimizer.zero_grad()
        loss_fn(net(x), y).backward()
        optimizer.step()
for epoch in range(3):
    train_epoch(model, loader)
    validate(model, val_loader)
"""
    assert lines(src) == [5]
    assert lines(src.replace("def train_epoch(net, data):\n", "def train_epoch(net, data):\n    net.train()\n")) == []


def test_helper_that_restores_was_training_is_silent():
    assert lines(HEAD + """\
def validate(net, data):
    was_training = net.training
    net.eval()
    out = [net(x) for x in data]
    net.train(was_training)
    return out
for epoch in range(3):
    for x, y in loader:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
    validate(model, val_loader)
""") == []


def test_method_that_switches_parts_back_is_silent():
    assert lines("""\
        import torch
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.head = nn.Sequential(nn.Linear(4, 2), nn.Dropout(0.1))
            def train_head(self):
                self.head.train()
        model = Net()
        for epoch in range(3):
            model.train_head()
            for x, y in loader:
                loss_fn(model(x), y).backward()
                optimizer.step()
            model.eval()
    """) == []


def test_module_without_mode_layers_is_silent():
    assert lines(loop().replace("nn.Dropout(0.5), ", "")) == []


def test_lightning_module_is_silent():
    assert lines("""\
        import torch
        import pytorch_lightning as pl
        from torch import nn
        class Lit(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.net = nn.Sequential(nn.Linear(4, 2), nn.Dropout(0.1))
            def fit_by_hand(self, loader):
                for x, y in loader:
                    self.manual_backward(self.net(x).sum())
                    self.optimizers().step()
                    self.net.eval()
    """) == []


def test_mlx_nn_is_silent():
    assert lines("""\
        import mlx.nn as nn
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5))
        for epoch in range(3):
            for x, y in loader:
                loss_and_grad(model, x, y)
                optimizer.update(model, grads)
            model.eval()
    """) == []


def test_alias_import():
    src = loop(before="model.train()\n").replace("from torch import nn", "import torch.nn as tnn").replace(
        "nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))",
        "tnn.Sequential(tnn.Linear(4, 8), tnn.Dropout(0.5), tnn.Linear(8, 2))")
    assert lines(src) == [10]


def test_message_names_the_module_and_the_fix():
    result = lint_source(loop(), "x.py", [TrainNotRestored])
    (d,) = result.diagnostics
    assert "`model`" in d.message and "model.train()" in f"{d.message} {d.detail}" and d.fix is None


FACTORY = """\
import torch
from torch import nn
from mylib import BaseModel


class PlainMLP(nn.Module, BaseModel):
    \"\"\"An MLP without Dropout (the docstring names no layer).\"\"\"

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), {layer}nn.Linear(8, 2))

    def forward(self, x):
        return self.body(x)


def make_parts():
    return load_data(), PlainMLP()


def run():
    data, model = make_parts()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for epoch in range(3):
        for x, y in data:
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            optimizer.step()
        model.eval()
"""


def test_module_from_a_same_file_factory_without_mode_layers_is_silent():
    assert lines(FACTORY.format(layer="")) == []


def test_module_from_a_same_file_factory_with_dropout_fires():
    assert lines(FACTORY.format(layer="nn.Dropout(0.2), ")) == [30]


def test_helper_that_builds_the_module_it_trains_is_silent():
    assert lines(HEAD + """\
def fit(data):
    net = nn.Sequential(nn.Linear(4, 2), nn.Dropout(0.1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in data:
        loss_fn(net(x), y).backward()
        opt.step()
    net.eval()
    return net
for fold in range(3):
    net = fit(loader)
""") == []


def test_training_helper_that_switches_back_through_a_hook_method_is_silent():
    assert lines("""\
        import torch
        from torch import nn
        class Trainer:
            def __init__(self):
                self.model = nn.Sequential(nn.Linear(4, 2), nn.Dropout(0.1))
            def train_epoch_start(self):
                self.model.train()
            def eval_epoch_start(self):
                self.model.eval()
            def run_train_epoch(self, data):
                self.train_epoch_start()
                for x, y in data:
                    self.loss(self.model(x), y).backward()
                    self.optimizer.step()
            def run_eval_epoch(self, data):
                self.eval_epoch_start()
            def fit(self, data, epochs):
                for epoch in range(epochs):
                    self.run_train_epoch(data)
                    self.run_eval_epoch(data)
    """) == []


_PRUNER = """
import torch

class FineTuner:
    def test(self):
        self.model.eval()
        return sum(self.model(x).argmax(1).eq(y).sum().item() for x, y in self.test_loader)

    def train_epoch(self, optimizer):
        {top}
        for x, y in self.loader:
            self.model.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            optimizer.step()

    def prune(self, optimizer):
        for _ in range(10):
            self.train_epoch(optimizer)
            self.test()
"""


def test_a_training_helper_that_switches_to_train_itself_restores_the_mode():
    """jindongwang/transferlearning's pruning fine-tuner: ``test()`` ends in ``eval()``, and the next
    iteration's ``train_epoch()`` calls ``self.model.train()`` before it trains."""
    assert lines(_PRUNER.format(top="self.model.train()")) == []
    assert lines(_PRUNER.format(top="pass")) == [6]


_TEACHER = """
import copy
import torch
from torch import nn
student = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 2))
teacher = copy.deepcopy(student)
{freeze}
optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
for step, (x, y) in enumerate(loader):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(student(x), teacher(x))
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        teacher.load_state_dict(student.state_dict())
        teacher.eval()
"""


@pytest.mark.parametrize("freeze, flagged", [
    ("teacher.requires_grad_(False)", False),
    ("for p in teacher.parameters():\n    p.requires_grad = False", False),
    ("for p in teacher.parameters():\n    p.requires_grad_(False)", False),
    ("teacher.requires_grad_(False)\nteacher.requires_grad_(True)", True),  # unfrozen again
    ("for p in student.parameters():\n    p.requires_grad = False", True),  # another module frozen
    ("pass", True),
])
def test_a_frozen_teacher_may_stay_in_eval_mode(freeze, flagged):
    """openai/consistency_models' progressive distillation: the teacher is frozen with
    ``requires_grad_(False)`` and put back in eval mode after each refresh from the student; it takes
    no optimizer step, so no training iteration needs its training mode."""
    src = _TEACHER.format(freeze=freeze)
    eval_line = src[:src.index("teacher.eval()")].count("\n") + 1
    assert lines(src) == ([eval_line] if flagged else [])


_CELL = """
def get_model():
    model = nn.Sequential(nn.Linear(784, 100), {layers}nn.ReLU(), nn.Linear(100, 10))
    return model, nn.CrossEntropyLoss(), torch.optim.SGD(model.parameters(), lr=0.1)


def train_batch(x, y, model, opt, loss_fn):
    {top}
    loss_fn(model(x), y).backward()
    opt.step()
    opt.zero_grad()


def val_loss(x, y, model):
    model.eval()
    with torch.no_grad():
        return loss_fn(model(x), y).item()


model, loss_fn, optimizer = get_model()
for epoch in range(5):
    for x, y in trn_dl:
        train_batch(x, y, model, optimizer, loss_fn)
    for x, y in val_dl:
        validation_loss = val_loss(x, y, model)
"""


@pytest.mark.parametrize("top, flagged", [("pass", True), ("model.train()", False)])
def test_a_model_from_an_unpacked_factory_starts_in_training_mode(top, flagged):
    # Packt's Modern-Computer-Vision-with-PyTorch, Chapter03/Batch_normalization.ipynb: the cells of a
    # mode-free model (whose eval() changes nothing), then the same cells again for a batch-norm model;
    # ``model, loss_fn, optimizer = get_model()`` builds the new model in training mode, and its
    # val_loss() leaves it in eval mode for the next epoch
    first = _CELL.format(layers="", top=top)
    second = _CELL.format(layers="nn.BatchNorm1d(100), ", top=top)
    src = "import torch\nfrom torch import nn\n" + first + second
    eval_line = src[:src.rindex("model.eval()")].count("\n") + 1
    assert lines(src) == ([eval_line] if flagged else [])


_BASEMODEL = """
import torch
from torch import nn


class BaseModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.dnn = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))

    def forward(self, x):
        return self.dnn(x)

    def fit(self, loader, val_x):
        model = self.train()
        for epoch in range(3):
            {top}
            for x, y in loader:
                loss = self.loss_func(model(x), y)
                self.optim.zero_grad()
                loss.backward()
                self.optim.step()
            self.evaluate(val_x)

    def evaluate(self, x):
        return self.predict(x)

    def predict(self, x):
        model = self.eval()
        with torch.no_grad():
            return model(x)
"""


@pytest.mark.parametrize("top, flagged", [("pass", True), ("model.train()", False)])
def test_a_module_trained_through_an_alias_its_train_call_returned(top, flagged):
    # shenweichen/DeepCTR-Torch's BaseModel.fit: ``model = self.train()`` once before the epochs, then
    # ``evaluate()`` -> ``predict()`` runs ``model = self.eval()`` after every epoch
    src = _BASEMODEL.format(top=top)
    eval_line = src[:src.index("model = self.eval()")].count("\n") + 1
    assert lines(src) == ([eval_line] if flagged else [])
