"""TGL301 amp-clip-without-unscale on short snippets the fixtures do not cover."""

from rule_snippets import finding_lines

from torchgradlint.rules.amp_clip_without_unscale import AmpClipWithoutUnscale


def lines(src: str) -> list[int]:
    return finding_lines(AmpClipWithoutUnscale, src)


def test_clip_right_after_scaled_backward_is_flagged():
    assert lines("""
        import torch
        scaler = torch.cuda.amp.GradScaler()
        for x in loader:
            optimizer.zero_grad()
            scaler.scale(model(x).mean()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
    """) == [7]


def test_aliases_bound_scaled_loss_and_non_literal_enabled_flag():
    assert lines("""
        import torch.nn as tnn
        from torch.nn.utils import clip_grad_value_ as clipv
        from torch.amp import GradScaler
        def train(model, opt, loader, args):
            amp_scaler = GradScaler("cuda", enabled=args.fp16)
            for x in loader:
                scaled = amp_scaler.scale(model(x).sum())
                scaled.backward()
                tnn.utils.clip_grad_norm_(model.parameters(), max_norm=args.clip)
                clipv(model.parameters(), 0.1)
                amp_scaler.step(opt)
                amp_scaler.update()
    """) == [10, 11]


def test_clip_after_accumulation_loop_and_in_a_helper():
    assert lines("""
        import torch
        class Trainer:
            def __init__(self):
                self.scaler = torch.amp.GradScaler("cuda")
            def clip(self):
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            def step(self, micro_batches):
                for mb in micro_batches:
                    self.scaler.scale(self.model(mb).mean()).backward()
                self.clip()
                self.scaler.step(self.optimizer)
                self.scaler.update()
    """) == [7]


def test_second_scaled_backward_needs_its_own_unscale():
    assert lines("""
        import torch
        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            scaler.scale(d_loss(x)).backward()
            scaler.unscale_(opt_d)
            torch.nn.utils.clip_grad_norm_(D.parameters(), 1.0)
            scaler.step(opt_d)
            scaler.scale(g_loss(x)).backward()
            torch.nn.utils.clip_grad_norm_(G.parameters(), 1.0)
            scaler.step(opt_g)
            scaler.update()
    """) == [10]


def test_unscale_first_even_under_a_gate_or_in_a_helper_is_silent():
    assert lines("""
        import torch
        scaler = torch.amp.GradScaler("cuda")
        def unscale_and_clip(opt, model):
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for i, x in enumerate(loader):
            scaler.scale(model(x).mean()).backward()
            if (i + 1) % 4 == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                scaler.update()
            else:
                unscale_and_clip(optimizer, model)
    """) == []


def test_near_misses_are_silent():
    assert lines("""
        import math
        import torch
        scaler = torch.amp.GradScaler("cuda")
        off = torch.amp.GradScaler("cuda", enabled=False)
        for x in loader:
            scaler.scale(model(x).mean()).backward()
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0 * scaler.get_scale())
            cap = args.max_norm * scaler.get_scale()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cap)
            torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf"))
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf)
            scaler.step(optimizer)
            scaler.update()
        for x in loader:
            off.scale(model(x).mean()).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            off.step(optimizer)
            off.update()
    """) == []


def test_clip_in_the_non_amp_branch_is_silent_and_the_amp_branch_fires():
    assert lines("""
        import torch
        def run_batch(self, loss):
            if self.use_amp:
                self.scaler.scale(loss).backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                self.optimizer.step()
        def run_epoch(self, loader):
            for x in loader:
                run_batch(self, self.model(x))
            for x in loader:
                run_batch(self, self.model(x))
    """) == [6]


def test_unscale_in_the_caller_of_a_backward_helper_is_silent():
    assert lines("""
        import torch
        class Trainer:
            def training_step(self, x):
                loss = self.model(x).mean()
                self.scaler.scale(loss).backward()
                return loss
            def loop(self, loader):
                for x in loader:
                    self.training_step(x)
                    self.scaler.unscale_(self.optimizer)
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
    """) == []


def test_clip_before_the_backward_and_foreign_names_are_silent():
    assert lines("""
        import torch
        from flax import linen as nn
        for x in loader:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.scale(model(x).mean()).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
    """) == []


def test_a_scale_method_of_something_else_is_not_a_scaler():
    assert lines("""
        import torch
        for x in loader:
            transform.scale(model(x)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
    """) == []
