"""TGL001 missing-zero-grad on short snippets the fixtures do not cover."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.missing_zero_grad import MissingZeroGrad


def lines(src: str) -> list[int]:
    """Lines of the TGL001 findings in ``src``."""
    result = lint_source(textwrap.dedent(src), "x.py", [MissingZeroGrad])
    return [d.line for d in result.diagnostics if d.code == "TGL001"]


def test_nested_loops_reset_only_in_outer_loop_is_flagged():
    assert lines("""
        import torch
        for epoch in range(3):
            opt.zero_grad()
            for x, y in loader:
                loss = crit(model(x), y)
                loss.backward()
                opt.step()
        """) == [8]


def test_accumulation_over_inner_loop_with_reset_in_outer_loop_is_silent():
    assert lines("""
        import torch
        for batch in loader:
            optimizer.zero_grad()
            for chunk in batch.split(4):
                model(chunk).sum().backward()
            optimizer.step()
        """) == []


def test_for_opt_in_opts_step_without_reset_is_flagged():
    assert lines("""
        import torch
        for x in loader:
            loss = model(x).sum()
            loss.backward()
            for opt in opts:
                opt.step()
        """) == [7]


def test_for_opt_in_opts_with_reset_is_silent():
    assert lines("""
        import torch
        for x in loader:
            for opt in opts:
                opt.zero_grad()
            model(x).sum().backward()
            for opt in opts:
                opt.step()
        """) == []


def test_env_step_is_not_an_optimizer_step():
    assert lines("""
        import torch
        for t in range(1000):
            action = policy(obs)
            obs, reward, done, info = env.step(action)
            loss = -reward * action.log_prob
            loss.backward()
        """) == []


def test_module_level_script_loop_is_flagged():
    assert lines("""
        import torch
        from torch import nn
        model = nn.Linear(3, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(100):
            loss = model(torch.randn(8, 3)).pow(2).mean()
            loss.backward()
            optimizer.step()
        """) == [9]


def test_while_true_loop_is_flagged():
    assert lines("""
        import torch
        while True:
            batch = next(it)
            loss = model(batch).mean()
            loss.backward()
            optimizer.step()
            if done():
                break
        """) == [7]


def test_while_true_loop_with_reset_is_silent():
    assert lines("""
        import torch
        while True:
            optimizer.zero_grad()
            loss = model(next(it)).mean()
            loss.backward()
            optimizer.step()
        """) == []


def test_torch_xla_optimizer_step_is_flagged():
    assert lines("""
        import torch
        import torch_xla.core.xla_model as xm
        for data, target in loader:
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
        """) == [7]


def test_torch_xla_optimizer_step_with_set_to_none_is_silent():
    assert lines("""
        import torch
        import torch_xla.core.xla_model as xm
        for data, target in loader:
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(data), target)
            loss.backward()
            xm.optimizer_step(optimizer)
        """) == []


def test_module_zero_grad_resets_every_optimizer():
    assert lines("""
        import torch
        for x in loader:
            model.zero_grad(set_to_none=True)
            model(x).sum().backward()
            opt_a.step()
            opt_b.step()
        """) == []


def test_grad_zero_inplace_is_a_reset():
    assert lines("""
        import torch
        for x in loader:
            model(x).sum().backward()
            optimizer.step()
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.zero_()
        """) == []


def test_amp_scaler_step_is_flagged():
    assert lines("""
        import torch
        scaler = torch.cuda.amp.GradScaler()
        for x in loader:
            with torch.autocast("cuda"):
                loss = model(x).mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        """) == [8]


def test_autograd_grad_does_not_accumulate():
    assert lines("""
        import torch
        for x in loader:
            loss = model(x).mean()
            grads = torch.autograd.grad(loss, params)
            for p, g in zip(params, grads):
                p.grad = g
            optimizer.step()
        """) == []


def test_step_without_backward_in_loop_is_silent():
    assert lines("""
        import torch
        loss.backward()
        for _ in range(3):
            optimizer.step()
        """) == []


def test_reset_targets_another_optimizer_is_flagged():
    assert lines("""
        import torch
        opt_a = torch.optim.SGD(a.parameters(), lr=0.1)
        opt_b = torch.optim.SGD(b.parameters(), lr=0.1)
        for x in loader:
            opt_a.zero_grad()
            (a(x) + b(x)).sum().backward()
            opt_a.step()
            opt_b.step()
        """) == [9]


def test_reset_of_known_optimizer_covers_unknown_stepped_one():
    # `opt` may be the same object as `optimizer`: stay silent.
    assert lines("""
        import torch
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        opt = optimizer
        for x in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            opt.step()
        """) == []


def test_helper_with_its_own_loop_is_reported_once_inside_the_helper():
    assert lines("""
        import torch
        def train_epoch(model, loader, optimizer):
            for x, y in loader:
                loss = crit(model(x), y)
                loss.backward()
                optimizer.step()

        for epoch in range(10):
            train_epoch(model, loader, optimizer)
        """) == [7]


def test_helper_with_its_own_loop_and_reset_is_silent():
    assert lines("""
        import torch
        def train_epoch(model, loader, optimizer):
            for x, y in loader:
                optimizer.zero_grad()
                crit(model(x), y).backward()
                optimizer.step()

        for epoch in range(10):
            train_epoch(model, loader, optimizer)
        """) == []


def test_method_helper_called_through_self_is_flagged_at_the_call():
    assert lines("""
        import torch
        class Trainer:
            def step_once(self, batch):
                loss = self.model(batch).mean()
                loss.backward()
                self.optimizer.step()

            def fit(self, loader):
                for batch in loader:
                    self.step_once(batch)
        """) == [11]


def test_stepping_helper_applied_after_backward_in_loop_is_flagged():
    assert lines("""
        import torch
        def apply_updates(opts):
            for opt in opts:
                opt.step()

        for x in loader:
            model(x).sum().backward()
            apply_updates(opts)
        """) == [9]


def test_lbfgs_closure_defined_outside_loop():
    assert lines("""
        import torch
        optimizer = torch.optim.LBFGS(model.parameters())
        def closure():
            optimizer.zero_grad()
            loss = crit(model(x), y)
            loss.backward()
            return loss
        for _ in range(20):
            optimizer.step(closure)
        """) == []


def test_lightning_training_step_is_silent():
    assert lines("""
        import torch
        import lightning as L
        class Lit(L.LightningModule):
            def training_step(self, batch, idx):
                opt = self.optimizers()
                loss = self.model(batch).mean()
                self.manual_backward(loss)
                opt.step()
                return loss
        """) == []


def test_scheduler_step_alone_is_not_an_optimizer_step():
    assert lines("""
        import torch
        for epoch in range(5):
            for x in loader:
                optimizer.zero_grad()
                model(x).mean().backward()
                optimizer.step()
            lr_scheduler.step()
            scheduler.step(val_loss)
        """) == []


@pytest.mark.parametrize("reset", [
    "optimizer.zero_grad(set_to_none=False)",
    "model.zero_grad()",
    "zero_grads(model)",
])
def test_reset_spellings(reset):
    assert lines(f"""
        import torch
        def zero_grads(m):
            m.zero_grad(set_to_none=True)
        for x in loader:
            {reset}
            model(x).mean().backward()
            optimizer.step()
        """) == []


def test_reset_before_the_loop_only_is_flagged():
    assert lines("""
        import torch
        optimizer.zero_grad()
        for x in loader:
            model(x).mean().backward()
            optimizer.step()
        """) == [6]


def test_mxnet_file_is_not_judged_by_torch_semantics():
    # MXNet overwrites gradients by default (grad_req="write").
    assert lines("""
        from mxnet import autograd, gluon
        for x, y in loader:
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(batch_size)
            optimizer.step()
        """) == []


def test_step_site_marks_steps_inside_helper_training_loops():
    import libcst as cst

    from torchgradlint.analysis import build_model
    from torchgradlint.analysis.training import step_sites

    src = textwrap.dedent("""
        def epoch(loader):
            for x in loader:
                model(x).sum().backward()
                optimizer.step()
        def once(x):
            model(x).sum().backward()
            optimizer.step()
        for e in range(3):
            epoch(loader)
            once(x)
        """)
    model = build_model(cst.parse_module(src), src, "x.py")
    sites = step_sites(model, model.module_scope.order, model.module_scope.end)
    flags = {(s.via.func_text, s.in_helper_loop) for s in sites}
    assert flags == {("optimizer.step", False), ("epoch", True), ("once", False)}
