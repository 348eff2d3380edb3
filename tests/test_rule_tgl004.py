"""TGL004 clip-grad-misordered on short snippets the fixtures do not cover."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.clip_grad_misordered import ClipGradMisordered


def lines(src: str) -> list[int]:
    """Lines of the TGL004 findings in ``src``."""
    result = lint_source(textwrap.dedent(src), "x.py", [ClipGradMisordered])
    return [d.line for d in result.diagnostics if d.code == "TGL004"]


HEAD = """\
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""
CLIP = "torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)"


def loop(*stmts: str, head: str = HEAD) -> str:
    return head + "for x, y in loader:\n" + "".join(f"    {s}\n" for s in stmts)


ZERO, BACKWARD, STEP = "optimizer.zero_grad()", "model(x).pow(2).mean().backward()", "optimizer.step()"


@pytest.mark.parametrize("stmts,line", [
    ((ZERO, BACKWARD, STEP, CLIP), 8),                          # after the step
    ((ZERO, BACKWARD, STEP, "scheduler.step()", CLIP), 9),      # after the step and the scheduler
    ((BACKWARD, STEP, CLIP, ZERO), 7),                          # after the step, before the reset
    ((ZERO, CLIP, BACKWARD, STEP), 6),                          # before the backward
    ((CLIP, ZERO, BACKWARD, STEP), 5),
    ((ZERO, BACKWARD, STEP, "torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)"), 8),
    ((ZERO, BACKWARD, STEP, "accelerator.clip_grad_norm_(model.parameters(), 1.0)"), 8),
])
def test_misordered_clip_fires(stmts, line):
    assert lines(loop(*stmts)) == [line]


@pytest.mark.parametrize("stmts", [
    (ZERO, BACKWARD, CLIP, STEP),
    (ZERO, "scaler.scale(model(x).sum()).backward()", "scaler.unscale_(optimizer)", CLIP,
     "scaler.step(optimizer)", "scaler.update()"),
    (CLIP, STEP, ZERO, BACKWARD),                               # deferred: clips the previous backward
    (ZERO, BACKWARD, STEP, "n = torch.nn.utils.clip_grad_norm_(model.parameters(), float('inf'))"),
    (ZERO, BACKWARD, STEP, "n = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf)"),
    (ZERO, BACKWARD, STEP, "n = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)"),
    (ZERO, BACKWARD, CLIP, STEP, ZERO, "model(x).sum().backward()", CLIP, STEP),  # two updates, both in order
])
def test_in_order_or_uncapped_is_silent(stmts):
    assert lines(loop(*stmts, head="import math\n" + HEAD)) == []


def test_aliases_resolve():
    assert lines("""\
        import torch.nn.utils as U
        from torch.nn.utils import clip_grad_norm_ as cgn
        from torch import optim
        import torch
        net = torch.nn.Linear(2, 2)
        opt = optim.Adam(net.parameters())
        for batch in loader:
            opt.zero_grad()
            net(batch).sum().backward()
            opt.step()
            cgn(net.parameters(), 0.5)
            U.clip_grad_norm_(net.parameters(), 0.5)
    """) == [11, 12]


def test_train_step_function_is_one_iteration():
    src = HEAD + """\
def train_step(batch):
    optimizer.zero_grad()
    loss = model(batch).sum()
    loss.backward()
    optimizer.step()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    return loss.item()
"""
    assert lines(src) == [9]


def test_branches_that_exclude_each_other():
    src = loop(ZERO, BACKWARD, "if use_amp:", "    scaler.step(optimizer)", "else:", "    " + CLIP,
               "    optimizer.step()")
    assert lines(src) == []


def test_lbfgs_closure_is_silent():
    assert lines("""\
        import torch
        model = torch.nn.Linear(3, 1)
        optimizer = torch.optim.LBFGS(model.parameters())
        for x, y in loader:
            def closure():
                optimizer.zero_grad()
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                return loss
            optimizer.step(closure)
    """) == []


LIGHTNING = """\
import torch
import IMPORT
class Lit(BASE):
    def training_step(self, batch, batch_idx):
        loss = self.net(batch).sum()
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
        return loss
    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
    def on_before_optimizer_step(self, optimizer):
        torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
"""


@pytest.mark.parametrize("imp,base", [("pytorch_lightning as pl", "pl.LightningModule"),
                                      ("lightning as L", "L.LightningModule"),
                                      ("lightning.pytorch as lp", "lp.LightningModule")])
def test_lightning_training_step_fires(imp, base):
    assert lines(LIGHTNING.replace("IMPORT", imp).replace("BASE", base)) == [6]


def test_lightning_manual_optimization_is_judged_by_order():
    assert lines("""\
        import torch
        import lightning.pytorch as pl
        class Lit(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.automatic_optimization = False
            def training_step(self, batch, batch_idx):
                opt = self.optimizers()
                opt.zero_grad()
                self.manual_backward(self.net(batch).sum())
                torch.nn.utils.clip_grad_norm_(self.parameters(), 1.0)
                opt.step()
    """) == []


def test_plain_module_training_step_is_not_lightning():
    assert lines(LIGHTNING.replace("import IMPORT\n", "").replace("BASE", "torch.nn.Module")) == []


def test_foreign_clip_functions_are_silent():
    assert lines("""\
        import torch
        import mlx.optimizers as optim
        for x, y in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
            grads, _ = optim.clip_grad_norm(grads, max_norm=1.0)
    """) == []


def test_wrapper_told_not_to_clip_is_silent():
    # A same-signature wrapper of clip_grad_norm_ with a switch that only measures the norm.
    assert lines(loop(ZERO, BACKWARD, STEP, "n = clip_grad_norm_(model.parameters(), 1.0, clip_grad=False)",
                      head="from utils import clip_grad_norm_\n" + HEAD)) == []
    assert lines(loop(ZERO, BACKWARD, STEP, "n = clip_grad_norm_(model.parameters(), 1.0, clip_grad=True)",
                      head="from utils import clip_grad_norm_\n" + HEAD)) == [9]
