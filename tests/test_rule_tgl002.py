"""TGL002 backward-under-no-grad on short snippets the fixtures do not cover."""

import textwrap

from torchgradlint.engine import lint_source
from torchgradlint.rules.backward_under_no_grad import BackwardUnderNoGrad


def lines(src: str) -> list[int]:
    """Lines of the TGL002 findings in ``src``."""
    result = lint_source(textwrap.dedent(src), "x.py", [BackwardUnderNoGrad])
    return [d.line for d in result.diagnostics if d.code == "TGL002"]


def test_expression_target_under_no_grad():
    assert lines("""
        import torch
        with torch.no_grad():
            model(x).sum().backward()
        """) == [4]


def test_forward_in_region_backward_after_it():
    assert lines("""
        from torch import no_grad
        import torch.nn.functional as F
        import torch
        with no_grad():
            out = model(x)
        y = torch.randint(0, 3, (4,))
        loss = F.cross_entropy(out, y)
        loss.backward()
        """) == [9]


def test_set_grad_enabled_false_statement():
    assert lines("""
        import torch
        torch.set_grad_enabled(False)
        loss = model(x).sum()
        loss.backward()
        """) == [5]


def test_accelerator_and_autograd_backward():
    assert lines("""
        import torch
        with torch.inference_mode():
            loss = model(x).mean()
            accelerator.backward(loss)
            torch.autograd.backward(loss)
        """) == [5, 6]


def test_helper_called_only_under_no_grad():
    assert lines("""
        import torch
        def step(model, x):
            loss = model(x).mean()
            loss.backward()
        def main():
            with torch.no_grad():
                step(model, x)
        """) == [5]


def test_loss_computed_before_region_is_silent():
    assert lines("""
        import torch
        loss = model(x).sum()
        with torch.no_grad():
            loss.backward()
        """) == []


def test_enable_grad_nested_in_no_grad_is_silent():
    assert lines("""
        import torch
        with torch.no_grad():
            with torch.enable_grad():
                model(x).sum().backward()
        """) == []


def test_non_literal_flag_is_silent():
    assert lines("""
        import torch
        with torch.set_grad_enabled(training):
            loss = model(x).sum()
            loss.backward()
        """) == []


def test_leaf_created_under_no_grad_is_silent():
    assert lines("""
        import torch
        with torch.no_grad():
            w = torch.zeros(3, requires_grad=True)
            z = torch.randn(3)
            z.requires_grad_()
        (w * 2).sum().backward()
        z.sum().backward()
        """) == []


def test_unknown_helper_result_is_silent():
    assert lines("""
        import torch
        with torch.no_grad():
            loss = compute_loss(model, batch)
        loss.backward()
        """) == []


def test_parameterised_loss_on_detached_inputs_is_silent():
    assert lines("""
        import torch
        with torch.no_grad():
            feats = backbone(x)
        loss = criterion(feats, torch.zeros(4))
        loss.backward()
        """) == []


def test_nested_def_does_not_inherit_region():
    assert lines("""
        import torch
        @torch.no_grad()
        def outer(model, opt, x):
            def closure():
                loss = model(x).sum()
                loss.backward()
                return loss
            opt.step(closure)
        """) == []


def test_create_graph_under_no_grad_with_penalty_in_region():
    assert lines("""
        import torch
        out = critic(interp)
        with torch.no_grad():
            g = torch.autograd.grad(out, interp, torch.ones_like(out), create_graph=True)[0]
            penalty = (g.norm(2, dim=1) - 1).pow(2).mean()
        """) == [5]


def test_create_graph_under_no_grad_used_outside_is_silent():
    # torch records the double-backward graph even under no_grad; only a
    # penalty computed inside the region loses it.
    assert lines("""
        import torch
        out = critic(interp)
        with torch.no_grad():
            g = torch.autograd.grad(out, interp, torch.ones_like(out), create_graph=True)[0]
        penalty = (g.norm(2, dim=1) - 1).pow(2).mean()
        """) == []


def test_forward_reached_from_a_no_grad_tokenize_method_is_not_grad_disabled():
    # realcode: audiolm-pytorch 2.4.0 audiolm_pytorch/soundstream.py:73. `forward` runs through
    # `module(x)` (with grad, from the trainer) as well as through `self.forward(...)` from a
    # no_grad method: its same-file callers are not all its callers.
    assert lines("""
        import torch
        from torch import nn
        from torch.autograd import grad as torch_grad
        from einops import rearrange

        def gradient_penalty(wave, output):
            gradients = torch_grad(outputs=output, inputs=wave, grad_outputs=torch.ones_like(output),
                                   create_graph=True, retain_graph=True)[0]
            gradients = rearrange(gradients, 'b ... -> b (...)')
            return ((gradients.norm(2, dim=1) - 1) ** 2).mean()

        class SoundStream(nn.Module):
            @torch.no_grad()
            def tokenize(self, audio):
                self.eval()
                return self.forward(audio, return_codes_only=True)

            def forward(self, x, return_codes_only=False, apply_grad_penalty=False):
                if return_codes_only:
                    return x
                out = self.discr(x)
                if apply_grad_penalty:
                    return gradient_penalty(x, out)
                return out
        """) == []
