"""TGL005 grad-mode-leak on short snippets the fixtures do not cover."""

import pytest

from rule_snippets import finding_lines
from torchgradlint.engine import lint_source
from torchgradlint.rules.grad_mode_leak import GradModeLeak

TRAIN_LOOP = """
for epoch in range(3):
    model.train()
    optimizer.zero_grad()
    loss_fn(model(x), y).backward()
    optimizer.step()
    score = evaluate(model, x_val)
"""


def lines(src: str) -> list[int]:
    return finding_lines(GradModeLeak, src)


def helper(body: str, imports: str = "import torch\n") -> str:
    return imports + "def evaluate(model, x):\n    model.eval()\n" + body + "    return model(x)\n" + TRAIN_LOOP


def test_bare_switch_in_helper_called_from_training_loop():
    assert lines(helper("    torch.set_grad_enabled(False)\n")) == [4]


def test_no_grad_enter_in_helper():
    assert lines(helper("    torch.no_grad().__enter__()\n")) == [4]


@pytest.mark.parametrize("imports,stmt", [
    ("import torch as T\n", "    T.set_grad_enabled(False)\n"),
    ("from torch import set_grad_enabled\n", "    set_grad_enabled(False)\n"),
    ("from torch import autograd\n", "    autograd.set_grad_enabled(False)\n"),
    ("import torch\nfrom torch import no_grad as ng\n", "    ng().__enter__()\n"),
])
def test_aliases_resolve(imports, stmt):
    src = helper(stmt, imports)
    assert lines(src) == [imports.count("\n") + 3]


@pytest.mark.parametrize("body", [
    "    with torch.no_grad():\n        pass\n",
    "    with torch.set_grad_enabled(False):\n        pass\n",
    "    prev = torch.is_grad_enabled()\n    torch.set_grad_enabled(False)\n    out = model(x)\n"
    "    torch.set_grad_enabled(prev)\n",
    "    torch.set_grad_enabled(False)\n    try:\n        out = model(x)\n    finally:\n"
    "        torch.set_grad_enabled(True)\n",
    "    torch.set_grad_enabled(is_train)\n",
    "    ctx = torch.no_grad()\n    ctx.__enter__()\n    out = model(x)\n    ctx.__exit__(None, None, None)\n",
    # a temporary inference_mode guard is released at the end of the statement: it switches nothing
    "    torch.inference_mode().__enter__()\n",
    "    if fast:\n        torch.set_grad_enabled(False)\n",
])
def test_restored_or_unknown_is_silent(body):
    assert lines(helper(body)) == []


def test_decorated_helper_is_restored_by_its_decorator():
    src = helper("    torch.set_grad_enabled(False)\n").replace("def evaluate", "@torch.no_grad()\ndef evaluate")
    assert lines(src) == []


def test_caller_that_never_trains_after_is_silent():
    assert lines("""\
        import torch
        def test(model, x):
            torch.set_grad_enabled(False)
            return model(x)
        def main():
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            test(model, x_test)
    """) == []


def test_caller_that_switches_grad_back_is_silent():
    assert lines(helper("    torch.set_grad_enabled(False)\n") + "    torch.set_grad_enabled(True)\n") == []


def test_caller_trains_after_the_call_outside_a_loop():
    assert lines("""\
        import torch
        def warmup_check(model, x):
            torch.set_grad_enabled(False)
            return model(x)
        def main():
            warmup_check(model, x)
            loss_fn(model(x), y).backward()
            optimizer.step()
    """) == [3]


def test_method_without_callers_in_a_training_file():
    assert lines("""\
        import torch
        class Trainer:
            def train_step(self, x, y):
                self.opt.zero_grad()
                self.loss(self.model(x), y).backward()
                self.opt.step()
            def evaluate(self, x):
                torch.set_grad_enabled(False)
                return self.model(x)
    """) == [8]


def test_inference_only_helper_without_training_is_silent():
    assert lines("""\
        import torch
        def predict(model, x):
            torch.set_grad_enabled(False)
            return model(x)
    """) == []


def test_context_manager_class_is_silent():
    assert lines("""\
        import torch
        class Frozen:
            def __enter__(self):
                self.prev = torch.is_grad_enabled()
                torch.set_grad_enabled(False)
            def __exit__(self, *exc):
                torch.set_grad_enabled(self.prev)
        class Hooks:
            def on_eval_start(self):
                torch.set_grad_enabled(False)
            def on_eval_end(self):
                torch.set_grad_enabled(True)
        loss.backward()
        opt.step()
    """) == []


def test_bare_switch_in_training_loop_body():
    assert lines("""\
        import torch
        for epoch in range(3):
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            torch.set_grad_enabled(False)
            val = model(x_val)
    """) == [7]


@pytest.mark.parametrize("restore", ["torch.set_grad_enabled(True)", "torch.set_grad_enabled(phase == 'train')"])
def test_loop_that_switches_back_is_silent(restore):
    assert lines(f"""\
        import torch
        for epoch in range(3):
            {restore}
            for x, y in loader:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()
            torch.set_grad_enabled(False)
            val = model(x_val)
    """) == []


def test_loop_without_training_is_silent():
    assert lines("""\
        import torch
        for batch in loader:
            torch.set_grad_enabled(False)
            preds.append(model(batch))
    """) == []


def test_module_level_in_a_script_is_silent():
    assert lines("""\
        import torch
        torch.set_grad_enabled(False)
        model = load()
        for x in loader:
            print(model(x))
    """) == []


def test_module_level_in_a_library_module():
    assert lines("""\
        import torch
        torch.set_grad_enabled(False)

        def encode(model, x):
            return model(x)
    """) == [2]


def test_module_level_with_main_guard_is_silent():
    assert lines("""\
        import torch
        torch.set_grad_enabled(False)

        def encode(model, x):
            return model(x)

        if __name__ == "__main__":
            encode(None, None)
    """) == []


def test_other_frameworks_are_silent():
    assert lines("""\
        import paddle
        def evaluate(model, x):
            paddle.set_grad_enabled(False)
            return model(x)
        for x in loader:
            loss.backward()
            opt.step()
            evaluate(model, x)
    """) == []
    assert lines("from mylib import set_grad_enabled\n" + helper("    set_grad_enabled(False)\n", "")) == []


def test_message_names_the_function_and_the_fix():
    result = lint_source(helper("    torch.set_grad_enabled(False)\n"), "x.py", [GradModeLeak])
    (d,) = result.diagnostics
    text = f"{d.message} {d.detail}"
    assert "`evaluate()`" in d.message and "with torch.no_grad():" in text and d.fix is None


_RUN = """
import torch


def run_train(model, loader, optimizer):
    model.train()
    for x, y in loader:
        {enable}
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def run_eval(model, loader):
    model.eval()
    torch.set_grad_enabled(False)
    return [model(x) for x, _ in loader]


for epoch in range(10):
    run_train(model, train_loader, optimizer)
    run_eval(model, val_loader)
"""


@pytest.mark.parametrize("enable, expected", [
    ("torch.set_grad_enabled(True)", []),  # the training helper switches grad mode back on every step
    ("pass", [17]),
])
def test_a_training_helper_that_enables_grad_mode_restores_it(enable, expected):
    # Project-MONAI/tutorials' competition scripts (surgtoolloc, RANZCR): run_eval switches grad mode
    # off with a bare statement, run_train switches it on at the top of each step
    assert lines(_RUN.format(enable=enable)) == expected
