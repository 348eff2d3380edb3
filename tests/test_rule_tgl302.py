"""TGL302 amp-scaler-bypassed on short snippets the fixtures do not cover."""

from rule_snippets import finding_lines

from torchgradlint.rules.amp_scaler_bypassed import AmpScalerBypassed


def lines(src: str) -> list[int]:
    return finding_lines(AmpScalerBypassed, src)


def test_plain_step_after_scaled_backward_with_or_without_unscale():
    assert lines("""
        import torch
        grad_scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            optimizer.zero_grad()
            grad_scaler.scale(model(x).mean()).backward()
            optimizer.step()
        for x in loader:
            optimizer.zero_grad()
            grad_scaler.scale(model(x).mean()).backward()
            grad_scaler.unscale_(optimizer)
            optimizer.step()
            grad_scaler.update()
    """) == [7, 12]


def test_plain_step_in_a_helper_and_alias_imports():
    assert lines("""
        from torch.cuda.amp import GradScaler as GS
        class Trainer:
            def __init__(self, model):
                self.scaler = GS(enabled=True)
                self.opt = torch.optim.Adam(model.parameters())
            def optimizer_step(self):
                self.opt.step()
                self.opt.zero_grad()
            def fit(self, loader):
                for x in loader:
                    self.scaler.scale(self.model(x).sum()).backward()
                    self.optimizer_step()
    """) == [8]


def test_scaler_step_without_update_in_the_training_loop():
    assert lines("""
        import torch
        scaler = torch.amp.GradScaler("cuda")
        for epoch in range(10):
            for x in loader:
                optimizer.zero_grad()
                scaler.scale(model(x).mean()).backward()
                scaler.step(optimizer)
            scaler.update()
    """) == [8]


def test_step_and_update_in_the_same_branch_or_through_a_helper_are_silent():
    assert lines("""
        import torch
        scaler = torch.amp.GradScaler("cuda")
        def finish_step():
            scaler.step(optimizer)
            scaler.update()
        for i, x in enumerate(loader):
            scaler.scale(model(x).mean() / 4).backward()
            if (i + 1) % 4 == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        for x in loader:
            scaler.scale(model(x).mean()).backward()
            finish_step()
    """) == []


def test_amp_alternatives_in_two_ifs_or_one_are_silent():
    assert lines("""
        import torch
        def train(model, optimizer, loader, use_amp):
            scaler = torch.amp.GradScaler("cuda", enabled=use_amp)
            for x in loader:
                loss = model(x).mean()
                if use_amp:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                if use_amp:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    loss.backward()
                    optimizer.step()
    """) == []


def test_disabled_scaler_several_optimizers_and_a_plain_backward_in_between_are_silent():
    assert lines("""
        import torch
        off = torch.amp.GradScaler("cuda", enabled=False)
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            off.scale(model(x).mean()).backward()
            optimizer.step()
        for x in loader:
            scaler.scale(model(x).mean()).backward()
            for opt in (opt_enc, opt_dec):
                scaler.step(opt)
            scaler.update()
        for x in loader:
            scaler.scale(d_loss(x)).backward()
            scaler.step(opt_d)
            scaler.update()
            g_loss(x).backward()
            opt_g.step()
    """) == []


def test_step_in_a_function_without_a_loop_and_foreign_frameworks_are_silent():
    assert lines("""
        import torch
        def train_step(scaler, optimizer, loss):
            scaler.scale(loss).backward()
            scaler.step(optimizer)
        def schedule(lr_scheduler, scaler, loss):
            scaler.scale(loss).backward()
            lr_scheduler.step()
    """) == []
    assert lines("""
        import mxnet as mx
        for x in loader:
            scaler.scale(net(x)).backward()
            trainer.step(32)
    """) == []
