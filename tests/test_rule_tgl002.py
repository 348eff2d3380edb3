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


_SELF_CONDITIONING = """
    import torch
    from torch import nn
    import torch.nn.functional as F

    class Unet(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.channels = dim
            self.self_condition = True
            self.net = nn.Linear(2 * dim, dim)

        def forward(self, x, x_self_cond=None):
            x_self_cond = x_self_cond if x_self_cond is not None else torch.zeros_like(x)
            return self.net(torch.cat((x_self_cond, x), dim=1))

    class GaussianDiffusion(nn.Module):
        def __init__(self, model, image_size):
            super().__init__()
            self.model = model
            self.channels = self.model.channels
            self.image_size = image_size
            self.is_ddim_sampling = False

        def model_predictions(self, x):
            return self.model(x)

        @torch.inference_mode()
        def sample(self, x):
            return self.model_predictions(x)

        def p_losses(self, x):
            with torch.{region}():
                x_self_cond = self.model_predictions(x)
            out = self.model(x, x_self_cond)
            return F.mse_loss(out, x)

        def forward(self, img):
            return self.p_losses(img)

    class Trainer:
        def __init__(self, diffusion_model, lr=1e-3):
            self.model = diffusion_model
            self.channels = diffusion_model.channels
            self.image_size = diffusion_model.image_size
            sampling = diffusion_model.is_ddim_sampling
            self.opt = torch.optim.Adam(diffusion_model.parameters(), lr=lr)

        def train(self, loader):
            for data in loader:
                loss = self.model(data)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
    """


def test_inference_tensor_made_inside_a_module_forward_reaches_the_trainer_backward():
    # devset lucidrains/denoising-diffusion-pytorch #286: self-conditioning computed under
    # inference_mode inside GaussianDiffusion.forward; the Trainer receives the model as a
    # constructor parameter whose class is the one in-file module with the attributes it reads.
    src = _SELF_CONDITIONING.replace("{region}", "inference_mode")
    assert lines(src) == [src.count("\n", 0, src.index("loss.backward()")) + 1]


def test_self_conditioning_under_no_grad_is_silent():
    # the upstream fix (no_grad), with the helper still also called from an @inference_mode sampler
    assert lines(_SELF_CONDITIONING.replace("{region}", "no_grad")) == []


def test_constructor_parameter_without_distinctive_attributes_is_unknown():
    # only nn.Module's own API is read on the parameter: no class can be inferred, no finding
    src = _SELF_CONDITIONING.replace("{region}", "inference_mode")
    src = src.replace("            self.channels = diffusion_model.channels\n", "")
    src = src.replace("            self.image_size = diffusion_model.image_size\n", "")
    src = src.replace("            sampling = diffusion_model.is_ddim_sampling\n", "")
    assert lines(src) == []


def test_annotated_constructor_parameter_gives_the_class():
    src = _SELF_CONDITIONING.replace("{region}", "inference_mode")
    src = src.replace("            self.channels = diffusion_model.channels\n", "")
    src = src.replace("            self.image_size = diffusion_model.image_size\n", "")
    src = src.replace("            sampling = diffusion_model.is_ddim_sampling\n", "")
    src = src.replace("def __init__(self, diffusion_model, lr", "def __init__(self, diffusion_model: GaussianDiffusion, lr")
    assert len(lines(src)) == 1


def test_constructor_call_site_gives_the_class():
    src = _SELF_CONDITIONING.replace("{region}", "inference_mode")
    src = src.replace("            self.channels = diffusion_model.channels\n", "")
    src = src.replace("            self.image_size = diffusion_model.image_size\n", "")
    src = src.replace("            sampling = diffusion_model.is_ddim_sampling\n", "")
    src += "\n    trainer = Trainer(GaussianDiffusion(Unet(4), 32))\n    trainer.train(loader)\n"
    assert len(lines(src)) == 1


_HELPER_ENTERS = """
    import torch

    def log_stats(model, x):
        torch.{api}().__enter__()
        return model(x).mean().item()

    for x, y in loader:
        loss = criterion(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        log_stats(model, x)
    """


def test_helper_entering_no_grad_without_exit_breaks_the_next_backward():
    assert lines(_HELPER_ENTERS.replace("{api}", "no_grad")) == [11]


def test_helper_entering_a_temporary_inference_mode_leaves_grad_on():
    # the temporary's guard is released at the end of the statement (measured, torch 2.13)
    assert lines(_HELPER_ENTERS.replace("{api}", "inference_mode")) == []


_TOWER = """
    import torch
    from torch import nn

    class CLIPVisionTower(nn.Module):
        def __init__(self, vision_tower, args, delay_load=False):
            super().__init__()
            self.vision_tower_name = vision_tower
            if not delay_load:
                self.load_model()
            {option}

        def load_model(self):
            self.vision_tower = CLIPVisionModel.from_pretrained(self.vision_tower_name)
            self.vision_tower.requires_grad_(False)

        @torch.no_grad()
        def forward(self, images):
            {body}
            return self.vision_tower(images, output_hidden_states=True).hidden_states[-2]
    """


def _tower(option: str = "pass", body: str = "pass") -> str:
    return _TOWER.replace("{option}", option).replace("{body}", body)


def _decorator_line(src: str) -> int:
    return src.count("\n", 0, src.index("@torch.no_grad()")) + 1


def test_no_grad_forward_of_a_tower_with_an_unfreeze_option():
    # devset TinyLLaVA clip_encoder.py (issue #17): `--tune_vision_tower` cannot train it
    src = _tower("if getattr(args, 'unfreeze_mm_vision_tower', False):\n                self.load_model()")
    assert lines(src) == [_decorator_line(src)]


def test_no_grad_forward_of_a_tower_made_trainable():
    src = _tower("self.vision_tower.requires_grad_(True)")
    assert lines(src) == [_decorator_line(src)]


def test_frozen_tower_with_no_grad_forward_is_silent():
    # LLaVA's frozen tower: only requires_grad_(False), no option to train it
    assert lines(_tower()) == []


def test_unfreeze_option_that_the_forward_honours_is_silent():
    option = "self.unfreeze = getattr(args, 'unfreeze_mm_vision_tower', False)"
    assert len(lines(_tower(option))) == 1
    assert lines(_tower(option).replace("@torch.no_grad()\n", "")) == []
    assert lines(_tower(option, "torch.set_grad_enabled(self.unfreeze)")) == []
    # branching on the option inside the decorated forward changes nothing: grad is still off
    assert len(lines(_tower(option, "if self.unfreeze:\n                return self.vision_tower(images)"))) == 1


_PENALTY_FORWARD = """
    import torch
    from torch import nn

    class GradientPenalty(nn.Module):
        def forward(self, critic, x):
            x = x.detach().requires_grad_(True)
            {forward}
            (g,) = torch.autograd.grad(scores, x, torch.ones_like(scores), create_graph=True)
            return g.norm()

    with torch.no_grad():  # validation
        print(GradientPenalty()(critic, batch))
    """


def test_backward_in_a_module_forward_is_reported():
    # evaluation calls the module under no_grad: the scores have no graph there
    assert lines(_PENALTY_FORWARD.format(forward="scores = critic(x)")) == [9]


def test_backward_in_a_forward_through_a_graph_built_with_grad_enabled_is_silent():
    # catalyst's GradientPenaltyLoss: the critic runs under set_grad_enabled(True) "to compute in
    # validation mode", so the scores have a graph in any caller's mode (fixture:
    # ok_forward_graph_built_under_enable_grad)
    for region in ("torch.set_grad_enabled(True)", "torch.enable_grad()"):
        assert lines(_PENALTY_FORWARD.format(forward=f"with {region}:\n                scores = critic(x)")) == []


def test_backward_in_a_forward_whose_graph_may_be_built_without_grad_is_reported():
    # an unknown flag, or a binding outside the region that may reach the call
    assert lines(_PENALTY_FORWARD.format(
        forward="with torch.set_grad_enabled(flag):\n                scores = critic(x)")) == [10]
    assert lines(_PENALTY_FORWARD.format(
        forward="scores = critic(x)\n            if fresh:\n                with torch.enable_grad():\n"
                "                    scores = critic(x)")) == [12]
    # the target is derived outside the region (``scores.sum()`` would be too): computed in the caller's mode
    assert lines(_PENALTY_FORWARD.format(
        forward="with torch.enable_grad():\n                raw = critic(x)\n            scores = raw * 2")) == [11]
