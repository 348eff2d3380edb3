"""The false-positive classes found by reviewing the corpora
(``realcode/corpora/fp_classes.md``), each as a silent snippet next to the
near miss that must still fire."""

import textwrap

import pytest

from torchgradlint.analysis.grad_mode import other_decorator
from torchgradlint.analysis.model import GradMode
from torchgradlint.cells import foreign_cell, foreign_spans
from torchgradlint.engine import lint_data, lint_source
from torchgradlint.registry import all_rules

RULES = [r for r in all_rules() if r.default_enabled]


def codes(src: str, path: str = "x.py") -> list[tuple[str, int]]:
    """``(code, line)`` of every default rule's finding in ``src``."""
    return [(d.code, d.line) for d in lint_source(textwrap.dedent(src), path, RULES).diagnostics]


# -- A: distributed autograd ---------------------------------------------------------------------
def test_dist_autograd_context_needs_no_reset():
    assert codes("""
        import torch
        import torch.distributed.autograd as dist_autograd
        opt = DistributedOptimizer(torch.optim.SGD, param_rrefs, lr=0.05)
        for x, y in loader:
            with dist_autograd.context() as context_id:
                loss = criterion(model(x), y)
                dist_autograd.backward(context_id, [loss])
                opt.step(context_id)
        """) == []


def test_local_backward_next_to_dist_autograd_import_still_fires():
    assert codes("""
        import torch
        import torch.distributed.autograd as dist_autograd
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
        """) == [("TGL001", 7)]


# -- B: optimizer and parameters built per iteration ---------------------------------------------
def test_new_optimizer_over_new_leaf_each_iteration_is_silent():
    assert codes("""
        import torch
        def refine(unet, latents, timesteps, lr):
            for t in timesteps:
                x_in = latents.detach().clone()
                x_in.requires_grad = True
                opt = torch.optim.SGD([x_in], lr=lr)
                loss = unet(x_in, t).pow(2).mean()
                loss.backward()
                opt.step()
                latents = x_in.detach()
            return latents
        """) == []


def test_new_model_moved_to_device_each_iteration_is_silent():
    assert codes("""
        import torch
        from torch import nn
        for lr in (0.1, 0.01):
            model = nn.Linear(2, 2).to("cpu")
            optim = torch.optim.SGD(model.parameters(), lr=lr)
            model(torch.ones(2, 2)).sum().backward()
            optim.step()
        """) == []


def test_new_optimizer_over_the_same_model_fires():
    assert codes("""
        import torch
        from torch import nn
        model = nn.Linear(2, 2)
        for lr in (0.1, 0.01):
            m = model.to("cpu")
            optim = torch.optim.SGD(m.parameters(), lr=lr)
            m(torch.ones(2, 2)).sum().backward()
            optim.step()
        """) == [("TGL001", 9)]


# -- I: closures through functools.partial ---------------------------------------------------------
def test_partial_closure_that_resets_is_silent():
    assert codes("""
        import functools
        import torch
        def fn_base(optimizer, w):
            optimizer.zero_grad()
            loss = (w * 2).sum()
            loss.backward()
            return loss
        optimizer = torch.optim.LBFGS([w])
        fn = functools.partial(fn_base, optimizer, w)
        for _ in range(20):
            optimizer.step(fn)
        """) == []


def test_partial_closure_without_reset_fires():
    assert codes("""
        import functools
        import torch
        def fn_base(optimizer, w):
            loss = (w * 2).sum()
            loss.backward()
            return loss
        optimizer = torch.optim.SGD([w], lr=0.1)
        for _ in range(20):
            loss = fn_base(optimizer, w)
            optimizer.step(functools.partial(fn_base, optimizer, w))
        """) == [("TGL001", 11)]


# -- G: accumulators rebuilt per outer iteration; unknown decorators -------------------------------
def test_list_rebuilt_every_outer_iteration_over_a_non_step_loop_is_silent():
    assert codes("""
        import torch
        for i in range(n_iter):
            probs = model(x).softmax(-1)
            loss = 0.0
            loss_list = []
            for bow in bows:
                bow_loss = -torch.log((probs @ bow).sum())
                loss += bow_loss
                loss_list.append(bow_loss)
            loss.backward()
        """) == []


def test_list_rebuilt_every_epoch_over_the_batch_loop_fires():
    assert codes("""
        import torch
        for epoch in range(10):
            losses = []
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss)
        """) == [("TGL101", 10)]


def test_decorator_named_after_inference_mode_disables_grad():
    src = """
        import torch
        from utils.torch_utils import {dec}
        @{dec}()
        def run(model, loader):
            total = 0
            for x, y in loader:
                total += criterion(model(x), y)
            return total
        def main():
            run(model, loader)
        main()
        """
    assert codes(src.format(dec="smart_inference_mode")) == []
    assert codes(src.format(dec="log_calls")) == []  # unknown decorator: grad mode unknown, no finding
    assert codes(src.format(dec="functools.lru_cache").replace("from utils.torch_utils import functools.lru_cache",
                                                               "import functools")) == [("TGL101", 8)]


def test_other_decorator_modes():
    assert other_decorator("utils.torch_utils.smart_inference_mode", False) is GradMode.DISABLED
    assert other_decorator("torch_no_grad", True) is GradMode.DISABLED
    assert other_decorator("functools.wraps", False) is None
    assert other_decorator("torch.jit.script", False) is None
    assert other_decorator("staticmethod", False) is None
    assert other_decorator("my_decorator", True) is None  # defined in this file
    assert other_decorator("utils.timed", False) is GradMode.UNKNOWN


# -- H: cells written for another framework -------------------------------------------------------
def test_foreign_cell_tags_and_imports():
    assert foreign_cell(["#@tab mxnet", "trainer.step(1)"])
    assert foreign_cell(["#@tab mxnet, tensorflow", "x = 1"])
    assert not foreign_cell(["#@tab pytorch", "x = 1"])
    assert not foreign_cell(["#@tab all", "x = 1"])
    assert foreign_cell(["from mxnet import gluon", "x = 1"])
    assert not foreign_cell(["from mxnet import gluon", "import torch"])
    assert not foreign_cell(["x = 1"])


MIXED = textwrap.dedent("""\
    # %%
    #@tab mxnet
    from mxnet import autograd, gluon
    # %%
    #@tab pytorch
    import torch
    # %%
    #@tab mxnet
    def train(net, loader, optimizer):  # a gluon.Trainer: Gluon overwrites gradients
        for X, y in loader:
            with autograd.record():
                l = loss(net(X), y)
            l.backward()
            optimizer.step(X.shape[0])
    # %%
    #@tab pytorch
    def train_torch(net, loader, optimizer):
        for X, y in loader:
            l = loss(net(X), y)
            l.backward()
            optimizer.step()
    """)


def test_percent_script_mxnet_cells_are_not_linted_torch_cells_are():
    assert foreign_spans(MIXED) == [(1, 3), (7, 14)]
    assert codes(MIXED) == [("TGL001", 21)]


def test_notebook_mxnet_cells_are_not_linted():
    import json

    cells = MIXED.split("# %%\n")[1:]
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
          "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    result = lint_data(json.dumps(nb).encode(), "x.ipynb", RULES)
    assert [(d.code, d.cell, d.line) for d in result.diagnostics] == [("TGL001", 4, 6)]


# -- C: no-grad work that is part of training ------------------------------------------------------
PPO = """
    import torch
    from torch import nn

    def train(agent, optimizer, data):
        loss = agent(data["obs"]).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    agent = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.1), nn.Linear(64, 2))
    optimizer = torch.optim.Adam(agent.parameters())
    obs = torch.zeros(128, 4)
    values = torch.zeros(128)
    for update in range(100):
        for step in range(128):
            with torch.no_grad():
                value = agent(next_obs)
                values[step] = value.flatten()
        data = {{"obs": obs, "values": values}}
        train(agent, optimizer, data)
    """


def test_rollout_stored_in_a_buffer_a_helper_trains_on_is_silent():
    assert codes(PPO.format()) == []


def test_no_grad_forward_whose_result_nothing_trains_on_fires():
    src = PPO.format().replace('data = {"obs": obs, "values": values}', 'data = {"obs": obs}')
    assert codes(src) == [("TGL201", 18)]


# -- notebooks: one unparsable cell ----------------------------------------------------------------
def test_notebook_with_an_unparsable_exercise_cell_lints_the_other_cells():
    import json

    cells = ["import torch\n", "def exercise():\n    # TODO: your code here\n",
             "for x, y in loader:\n    loss = crit(model(x), y)\n    loss.backward()\n    optimizer.step()\n"]
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": []} for c in cells],
          "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}
    result = lint_data(json.dumps(nb).encode(), "x.ipynb", RULES)
    found = [(d.code, d.cell, d.line) for d in result.diagnostics]
    assert found == [("TGL000", 2, 2), ("TGL001", 3, 4)]
    assert "cell 2 could not be parsed" in result.diagnostics[0].message


# -- I: optimizers sharing parameters (Lightning's configure_optimizers) ---------------------------
LIGHTNING_TWO_OPTIMIZERS = """
    import torch
    from lightning.pytorch import LightningModule

    class M(LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False
            self.gen = torch.nn.Linear(32, 2)
            self.disc = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            opt_a, opt_b = self.optimizers()
            self.manual_backward(self.disc(self.gen(batch)).sum())
            opt_a.step()
            self.manual_backward(self.disc(self.gen(batch)).sum())
            opt_b.step()
            opt_b.zero_grad()

        def configure_optimizers(self):
            return (torch.optim.SGD(self.{a}.parameters(), lr=0.1),
                    torch.optim.SGD(self.{b}.parameters(), lr=0.1))
    """


def test_reset_of_an_optimizer_over_the_same_parameters_covers_the_other():
    assert codes(LIGHTNING_TWO_OPTIMIZERS.format(a="gen", b="gen")) == []


def test_reset_of_an_optimizer_over_other_parameters_does_not_cover():
    assert codes(LIGHTNING_TWO_OPTIMIZERS.format(a="gen", b="disc")) == [("TGL001", 14)]


def test_objects_built_and_wrapped_in_each_iteration_need_no_reset():
    src = """
        import torch
        from torch.optim import SGD
        {outside}
        for cfg in configs:
            {inside}
            optim = OptimWrapper(SGD(model.parameters(), lr=0.1))
            model, optim = strategy.prepare(model=model, optim_wrapper=optim)
            loss = model(data)
            loss.backward()
            optim.step()
        """
    assert codes(src.format(outside="", inside="model = ToyModel()")) == []
    assert codes(src.format(outside="model = ToyModel()", inside="pass")) == [("TGL001", 11)]


# -- F: library models with no mode-dependent layers -----------------------------------------------
VAE = """
    import torch
    from diffusers import AutoencoderKL

    def log_validation(vae, images):
        with torch.no_grad():
            return [vae(x).sample for x in images]

    vae = AutoencoderKL.{ctor}
    optimizer = torch.optim.AdamW(vae.parameters())
    vae.train()
    for x in loader:
        loss = vae(x).sample.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        log_validation(vae, [x])
    """


def test_diffusers_vae_has_no_mode_dependent_layers():
    assert codes(VAE.format(ctor='from_pretrained("sd-vae")')) == []
    assert codes(VAE.format(ctor="from_config(config)")) == []


def test_diffusers_vae_built_with_dropout_is_mode_sensitive():
    assert codes(VAE.format(ctor="from_config(config, dropout=0.1)")) == [("TGL201", 7)]


PIPELINE = """
    import torch
    from diffusers import DDPMPipeline

    image_pipe = DDPMPipeline.from_pretrained("google/ddpm-celebahq-256")
    optimizer = torch.optim.AdamW(image_pipe.unet.parameters(), lr=1e-5)
    for step, batch in enumerate(loader):
        {train}
        loss = image_pipe.unet(batch, t).sample.pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            noise_pred = image_pipe.unet(x, t).sample
    """


@pytest.mark.parametrize("train, expected", [
    ("pass", []),  # the pipeline loads its UNet in eval mode and nothing switches it
    ("image_pipe.unet.train()", [("TGL201", 14)]),
])
def test_a_model_of_a_pretrained_pipeline_starts_in_eval_mode(train, expected):
    # huggingface/diffusion-models-class, unit 2's finetune_model.py
    assert codes(PIPELINE.format(train=train)) == expected


MONAI_UNET = """
    import torch
    from monai.networks.nets import DiffusionModelUNet

    model = DiffusionModelUNet(spatial_dims=2, in_channels=1, out_channels=1{extra})
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(10):
        model.train()
        for x in loader:
            optimizer.zero_grad()
            model(x, timesteps=t).pow(2).mean().backward()
            optimizer.step()
    with torch.no_grad():
        sample = model(noise, timesteps=t)
    """


@pytest.mark.parametrize("extra, expected", [
    ("", []),  # group norm, and no dropout by default (Project-MONAI/tutorials' ControlNet notebook)
    (", dropout_cattn=0.1", [("TGL201", 14)]),  # cross-attention dropout given
    (", **config", [("TGL201", 14)]),  # arguments the linter cannot see
])
def test_monai_diffusion_unet_has_no_mode_dependent_layers_by_default(extra, expected):
    assert codes(MONAI_UNET.format(extra=extra)) == expected


MONAI_SEGMENTATION = """
    import torch
    from monai.networks.nets import {cls}

    model = {cls}({args})
    optimizer = torch.optim.Adam(model.parameters())
    for epoch in range(10):
        model.train()
        for x, y in loader:
            optimizer.zero_grad()
            loss_function(model(x), y).backward()
            optimizer.step()
        with torch.no_grad():
            val = model(x_val)
    """


@pytest.mark.parametrize("cls, args, flagged", [
    # Project-MONAI/tutorials' UNETR and Swin UNETR notebooks: instance norm, every dropout rate 0
    ("UNETR", 'in_channels=1, out_channels=14, img_size=(96, 96, 96), norm_name="instance", dropout_rate=0.0',
     False),
    ("SwinUNETR", "img_size=(96, 96, 96), in_channels=1, out_channels=14, feature_size=48", False),
    ("UNet", "spatial_dims=3, in_channels=1, out_channels=2, channels=(16, 32), strides=(2,), norm=Norm.GROUP",
     False),
    ("UNet", "3, 1, 2, (16, 32), (2,), norm=Norm.BATCH", True),
    ("BasicUNet", 'spatial_dims=3, norm=("batch", {"eps": 1e-3})', True),
    ("SwinUNETR", "(96, 96, 96), 1, 14, drop_rate=0.1", True),
    ("UNETR", "1, 14, (96, 96, 96), norm_name=norm", True),  # a norm the linter cannot read
    ("UNet", "3, 1, 2, (16, 32), (2,), 3, 3, 0, 'PRELU', 'BATCH'", True),  # the norm given by position
])
def test_monai_segmentation_networks_are_judged_by_their_norm_and_dropout(cls, args, flagged):
    found = codes(MONAI_SEGMENTATION.format(cls=cls, args=args))
    assert bool(found) == flagged, found


SAMPLERS = """
    import torch
    from torch import nn

    class StratifiedSampler(nn.Module):
        def sample(self, t0, t1, n):
            return torch.linspace(0, 1, n) * (t1 - t0) + t0

    class Renderer(nn.Module):
        def render(self, rays, sampler, n):
            ts = sampler.sample(rays[0], rays[1], n)
            return ts, make_fine_sampler(ts)

        @torch.no_grad()
        def decode(self, rays):
            coarse = {coarse}
            _, fine = self.render(rays, coarse, 64)
            return self.render(rays, fine, 128)
    """


def test_fresh_mode_free_module_from_one_caller_and_unknown_from_another_is_silent():
    assert codes(SAMPLERS.format(coarse="StratifiedSampler()")) == []


def test_fresh_mode_sensitive_module_passed_by_a_caller_fires():
    assert codes(SAMPLERS.format(coarse="nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))")) == [("TGL201", 11)]


# -- misses: evaluation after a training helper whose step lives in another file --------------------
D2L_PREDICT = """
    import torch
    from torch import nn
    from d2l import torch as d2l

    def train(net, train_iter, num_epochs, lr):
        trainer = torch.optim.SGD(net.parameters(), lr=lr)
        for epoch in range(num_epochs):
            net.train()
            for features, labels in train_iter:
                d2l.train_batch_ch13(net, features, labels, loss, trainer, devices)

    net, preds = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Flatten(), nn.LazyLinear(10)), []
    train(net, train_valid_iter, 20, 0.1)
    {switch}
    for X, _ in test_iter:
        y_hat = net(X)
        preds.extend(y_hat.argmax(dim=1).cpu().numpy())
    """


def test_prediction_loop_after_a_training_helper_fires():
    assert codes(D2L_PREDICT.format(switch="")) == [("TGL201", 16)]


def test_prediction_loop_after_eval_is_silent():
    assert codes(D2L_PREDICT.format(switch="net.eval()")) == []


# -- misses: retain_graph=True in a helper called in a loop ----------------------------------------
UPDATE_LATENT = """
    import torch

    class Pipe:
        @staticmethod
        def _update_latent(latents, loss, step_size):
            grad = torch.autograd.grad(loss.requires_grad_(True), [latents], retain_graph=True)[0]
            return latents - step_size * grad

        def refine(self, latents, t, steps):
            for i in range(steps):
                latents = latents.clone().detach().requires_grad_(True)
                self.unet(latents, t)
                loss = self._compute_loss(self.attention_store.maxima())
                latents = self._update_latent(latents, loss, 0.1){later}
            return latents
    """


def test_retaining_backward_in_a_helper_called_in_a_loop_fires():
    assert codes(UPDATE_LATENT.format(later="")) == [("TGL102", 7)]


def test_retaining_backward_in_a_helper_whose_graph_a_later_backward_uses_is_silent():
    later = "\n                loss.backward()"
    assert codes(UPDATE_LATENT.format(later=later)) == []


def test_unknown_loss_rebuilt_each_iteration_and_retained_fires():
    assert codes("""
        import torch
        for batch in loader:
            loss = compute_loss(model, batch)
            loss.backward(retain_graph=True)
            optimizer.step()
            optimizer.zero_grad()
        """) == [("TGL102", 5)]


def test_unknown_target_bound_before_the_loop_is_silent():
    assert codes("""
        import torch
        y = simulate(params)
        for i in range(n):
            g = torch.autograd.grad(y[i], params, retain_graph=True)
        """) == []


# -- P (PyPI review): a graph prefix built before the loop needs retain_graph ----------------------
def test_backward_through_a_distribution_built_before_the_loop_is_silent():
    assert codes("""
        import torch
        from torch.autograd import grad
        from torch.distributions import Categorical
        def sampled_grads(x, mc_samples):
            x.requires_grad = True
            out = []
            dist = Categorical(logits=x)
            for _ in range(mc_samples):
                loss = -dist.log_prob(dist.sample()).sum()
                out.append(grad(loss, x, retain_graph=True)[0])
            return out
        """) == []


def test_slices_of_one_forward_before_the_loop_are_silent():
    assert codes("""
        import torch
        def multiple_passes(model, X, loss_func, num_chunks):
            reconstruction = model(X)
            size = reconstruction.shape[1] // num_chunks
            for idx in range(num_chunks):
                part = reconstruction[:, idx * size:(idx + 1) * size]
                loss_func(part, X[:, idx * size:(idx + 1) * size]).backward(retain_graph=True)
        """) == []


def test_hessian_rows_of_a_gradient_taken_before_the_loop_are_silent():
    assert codes("""
        import torch
        def hessian_diag(y, x, n):
            dy = torch.autograd.grad(y, [x], create_graph=True)[0]
            flat = dy.reshape(-1, n)
            rows = []
            for i in range(n):
                dyi = flat.index_select(-1, torch.tensor([i]))
                rows.append(torch.autograd.grad([dyi], [x], retain_graph=True)[0])
            return rows
        """) == []


def test_forward_rebuilt_in_the_loop_and_retained_still_fires():
    assert codes("""
        import torch
        def multiple_passes(model, X, loss_func, num_chunks):
            for idx in range(num_chunks):
                reconstruction = model(X)
                loss_func(reconstruction, X).backward(retain_graph=True)
        """) == [("TGL102", 6)]


# -- PyPI review classes (realcode/pypi_fp_classes.md) ----------------------------------------------
def test_self_loss_reset_at_the_top_of_each_iteration_is_silent():
    src = """
        import torch
        import torch.nn.functional as F
        class SGDUpdate:
            def training_epoch(self):
                {reset_outside}
                for self.mbatch in self.dataloader:
                    self.optimizer.zero_grad()
                    {reset_inside}
                    self.loss += F.cross_entropy(self.model(self.mbatch[0]), self.mbatch[1])
                    self.backward()
                    self.optimizer.step()
        """
    assert codes(src.format(reset_outside="pass", reset_inside="self.loss = torch.zeros(1)")) == []
    assert codes(src.format(reset_outside="self.loss = torch.zeros(1)", reset_inside="pass")) == [("TGL101", 10)]


def test_sequential_of_named_linears_and_linear_subclass_are_mode_free():
    assert codes("""
        from collections import OrderedDict
        import torch
        import torch.nn as nn
        class LinearSub(torch.nn.Linear):
            pass
        def check(x):
            a = nn.Sequential(OrderedDict([("l0", nn.Linear(5, 5)), ("l1", nn.Linear(5, 5))]))
            b = LinearSub(5, 5)
            model = torch.load("trained.pt")
            for batch in loader:
                loss = model(batch).sum()
                loss.backward()
            with torch.no_grad():
                return a(x), b(x)
        """) == []
    assert codes("""
        from collections import OrderedDict
        import torch
        import torch.nn as nn
        model = nn.Sequential(OrderedDict([("l0", nn.Linear(5, 5)), ("drop", nn.Dropout(0.5))]))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in loader:
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        with torch.no_grad():
            out = model(x_val)
        """) == [("TGL201", 12)]


def test_no_grad_target_in_a_loop_free_update_function_is_training():
    assert codes("""
        import torch
        class SAC(torch.nn.Module):
            def update(self, obs, act, target_q):
                dist = self.policy(obs)
                with torch.no_grad():
                    q = self.critic(obs)
                actor_loss = -(dist.probs * q).sum(-1).mean()
                self.policy_optim.zero_grad()
                actor_loss.backward()
                self.policy_optim.step()
                self.critic_optim.zero_grad()
                ((self.critic(obs) - target_q) ** 2).mean().backward()
                self.critic_optim.step()
        """) == []


def test_unit_test_of_a_fresh_random_module_is_silent_a_loaded_one_fires():
    src = """
        import torch
        import torch.nn as nn
        def test_hooks():
            model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
            {load}
            with torch.no_grad():
                out = model(torch.randn(2, 3))
            assert out.shape == (2, 4)
        """
    assert codes(src.format(load="pass")) == []
    assert codes(src.format(load='model.load_state_dict(torch.load("m.pt"))')) == [("TGL201", 8)]


def test_output_assigned_to_underscore_is_discarded():
    assert codes("""
        import torch
        import torch.nn as nn
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
        with torch.no_grad():
            _ = model(torch.randn(2, 3))
        """) == []


def test_backward_in_a_forward_that_steps_an_optimizer_is_a_training_driver():
    assert codes("""
        import torch
        from torch import nn
        class Imagine(nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model
                self.optimizer = torch.optim.Adam(self.model.parameters(), 1e-3)
            def forward(self):
                with torch.no_grad():
                    self.model()
                for i in range(10):
                    loss = self.model()
                    loss.backward()
                    self.optimizer.step()
                    self.optimizer.zero_grad()
        """) == []


def test_fresh_optimizer_over_fresh_copy_in_a_function_is_silent():
    assert codes("""
        import copy
        import torch
        def test_weight_update(module, x, y):
            a = copy.deepcopy(module)
            b = copy.deepcopy(module)
            opt_a = torch.optim.SGD(a.parameters(), lr=1)
            opt_b = torch.optim.SGD(b.parameters(), lr=1)
            opt_a.zero_grad()
            a(x).sum().backward()
            opt_a.step()
            b(x).sum().backward()
            opt_b.step()
        """) == []


def test_helper_named_after_item_detaches():
    assert codes("""
        import torch
        from pyro.infer.util import torch_item
        def loss_and_grads(batch, params):
            loss = 0
            for trace in batch:
                particle_loss = -trace.log_prob_sum()
                torch.autograd.grad(particle_loss, params)
                loss += torch_item(particle_loss)
            return loss
        """) == []


def test_step_given_a_loss_tensor_is_a_wrapper_that_resets_itself():
    assert codes("""
        import torch
        class CQL(torch.nn.Module):
            def update(self, obs, target):
                q = self.critic(obs)
                loss = torch.nn.functional.mse_loss(q, target)
                aux = self.log_alpha.exp() * q.mean()
                self.alpha_optim.zero_grad()
                aux.backward(retain_graph=True)
                self.alpha_optim.step()
                self.critic_optim.step(loss + aux)
        """) == []


# -- corpora run 7: a generator sampled on fixed noise in its own training loop (DCGAN tutorial) ----
_DCGAN = """
    import torch
    from torch import nn

    generator = nn.Sequential(nn.ConvTranspose2d(100, 64, 4), nn.BatchNorm2d(64), nn.ReLU(),
                              nn.ConvTranspose2d(64, 3, 4), nn.Tanh())
    discriminator = nn.Sequential(nn.Conv2d(3, 64, 4), nn.LeakyReLU(0.2), nn.Flatten(), nn.LazyLinear(1))
    optimizer_g = torch.optim.Adam(generator.parameters(), lr=2e-4)
    optimizer_d = torch.optim.Adam(discriminator.parameters(), lr=2e-4)
    criterion = nn.BCEWithLogitsLoss()
    fixed_noise = torch.randn(64, 100, 1, 1)
    for i, (real, _) in enumerate(dataloader):
        noise = torch.randn(real.size(0), 100, 1, 1)
        fake = generator(noise)
        optimizer_d.zero_grad()
        out = discriminator(fake.detach())
        criterion(out, torch.zeros_like(out)).backward()
        optimizer_d.step()
        optimizer_g.zero_grad()
        out = discriminator(fake)
        criterion(out, torch.ones_like(out)).backward()
        optimizer_g.step()
        if i % 500 == 0:
            with torch.no_grad():
                samples = generator({sample_input}).detach().cpu()
            save_image(samples, f"fake-{i}.png")
    """


def test_generator_sampled_on_fixed_noise_in_its_training_loop_is_silent():
    # pytorch-lightning examples/fabric/dcgan/train_torch.py:195, the PyTorch DCGAN tutorial's shape:
    # noise batches have the statistics of the training batches; this is no evaluation on held-out data
    assert codes(_DCGAN.replace("{sample_input}", "fixed_noise")) == []
    assert codes(_DCGAN.replace("{sample_input}", "torch.randn(16, 100, 1, 1)")) == []


def test_generator_run_on_a_data_batch_under_no_grad_still_fires():
    # the near miss: the module under no_grad gets data (an evaluation), not noise
    found = codes(_DCGAN.replace("{sample_input}", "real"))
    assert [c for c, _ in found] == ["TGL201"]


def test_pretrained_generator_sampled_on_noise_outside_training_still_fires():
    # not trained in this loop: a generator loaded and sampled in training mode
    assert [c for c, _ in codes("""
        import torch
        from torch import nn
        generator = nn.Sequential(nn.Linear(100, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 8))
        generator.load_state_dict(torch.load("g.pt"))
        generator.train()
        with torch.no_grad():
            samples = generator(torch.randn(64, 100))
        save_image(samples, "samples.png")
        """)] == ["TGL201"]


def test_generator_with_dropout_sampled_on_noise_still_fires():
    # dropout (a diffusion UNet's, pix2pix's) makes every sample worse in training mode
    src = _DCGAN.replace("{sample_input}", "fixed_noise").replace("nn.BatchNorm2d(64), nn.ReLU()",
                                                                  "nn.BatchNorm2d(64), nn.Dropout(0.1), nn.ReLU()")
    assert [c for c, _ in codes(src)] == ["TGL201"]


# -- PyPI class P (backpack nll_base.py:123): the pre-loop prefix comes from an abstract method -----
_SAMPLED_GRADS = """
    from torch import stack
    from torch.autograd import grad

    class NLLLossDerivatives:
        def _make_distribution(self, subsampled_input):
            raise NotImplementedError

        def sampled_grads(self, subsampled_input, mc_samples):
            subsampled_input.requires_grad = True
            gradients = []
            {before}
            for _ in range(mc_samples):
                {inside}
                y_tilde = dist.sample()
                loss_tilde = -dist.log_prob(y_tilde).sum()
                gradients.append(grad(loss_tilde, subsampled_input, retain_graph=True)[0])
            return stack(gradients)
    """


def test_distribution_from_an_abstract_method_before_the_loop_needs_retain_graph():
    src = _SAMPLED_GRADS.replace("{before}", "dist = self._make_distribution(subsampled_input)")
    assert codes(src.replace("{inside}", "pass")) == []


def test_distribution_rebuilt_every_iteration_does_not_need_retain_graph():
    src = _SAMPLED_GRADS.replace("{before}", "pass")
    found = codes(src.replace("{inside}", "dist = self._make_distribution(subsampled_input)"))
    assert [c for c, _ in found] == ["TGL102"]


# -- PyPI class L (avalanche der.py:323, er_ace.py:137, er_aml.py:152): reset, then if/else accumulate --
_STRATEGY = """
    import torch.nn.functional as F

    class DER(SupervisedTemplate):
        def training_epoch(self, **kwargs):
            for self.mbatch in self.dataloader:
                self.optimizer.zero_grad()
                {reset}
                self.mb_output = self.forward()
                if self.replay_loader is not None:
                    self.loss += F.cross_entropy(self.mb_output[self.k:], self.mb_y[self.k:])
                    self.loss += self.alpha * F.mse_loss(self.mb_output[: self.k], self.batch_logits)
                else:
                    self.loss += self.criterion()
                self.backward()
                self.optimizer_step()
    """


def test_attribute_accumulator_reset_each_iteration_then_accumulated_in_both_branches_is_silent():
    assert codes(_STRATEGY.replace("{reset}", "self.loss = self._make_empty_loss()")) == []


def test_attribute_accumulator_never_reset_still_fires():
    found = codes(_STRATEGY.replace("{reset}", "pass"))
    assert found and {c for c, _ in found} == {"TGL101"}


# -- a whole-module checkpoint the file saves and restores itself ---------------------------------
_SAVED_AND_RESTORED = """
    import torch
    import torch.nn as nn

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.MaxPool2d(2){extra})
            self.fc = nn.Linear(16 * 15 * 15, 10)
        def forward(self, x):
            return self.fc(self.layer(x).flatten(1))

    model = CNN()
    optimizer = torch.optim.Adam(model.parameters())
    try:
        model = torch.load({load})
    except Exception:
        pass
    for epoch in range(3):
        for x, y in train_loader:
            optimizer.zero_grad()
            loss = loss_func(model(x), y)
            loss.backward()
            optimizer.step()
        torch.save(model, './cifar_model.pkl')
    correct = 0
    for x, y in test_loader:
        correct += (model(x).argmax(1) == y).sum().item()
    """


def test_model_restored_from_its_own_checkpoint_is_judged_by_what_was_saved():
    # GunhoChoi/PyTorch-FastCampus CNN_CIFAR10: the loaded model is the CNN the notebook saved
    assert codes(_SAVED_AND_RESTORED.format(extra="", load="'./cifar_model.pkl'")) == []


def test_restored_checkpoint_of_a_model_with_dropout_still_fires():
    assert codes(_SAVED_AND_RESTORED.format(extra=", nn.Dropout(0.5)", load="'./cifar_model.pkl'")) == [
        ("TGL201", 27)]


def test_checkpoint_from_elsewhere_is_unknown_and_still_fires():
    # nothing in the file saves to this path: the loaded module may hold any layer
    assert codes(_SAVED_AND_RESTORED.format(extra="", load="'./pretrained.pkl'")) == [("TGL201", 27)]


def test_loaded_generator_sampled_on_noise_is_not_taken_for_batch_norm_only():
    # the noise-sampling exemption needs every construction visible: a load from
    # elsewhere may hold dropout
    src = """
        import torch
        import torch.nn as nn
        netG = torch.load("g.pt")
        opt = torch.optim.Adam(netG.parameters())
        for step in range(10):
            opt.zero_grad()
            loss = netG(torch.randn(8, 4)).sum()
            loss.backward()
            opt.step()
            with torch.no_grad():
                fake = netG(torch.randn(8, 4))
        """
    assert codes(src) == [("TGL201", 12)]



# -- a loop that never starts a second iteration ----------------------------------------------------
_ONE_BATCH = """
    import torch
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    {outer}for x, y in loader:
    {pad}    {skip}
    {pad}    loss = (model(x) - y).pow(2).mean()
    {pad}    loss.backward(retain_graph=True)
    {pad}    opt.step()
    {pad}    losses.append(loss)
    {pad}    {exit}
    """


def _one_batch(outer: str = "", skip: str = "pass", exit: str = "break") -> list[tuple[str, int]]:
    pad = "    " if outer else ""
    return codes(_ONE_BATCH.format(outer=outer + ("\n    " + pad if outer else ""), pad=pad, skip=skip, exit=exit))


def test_loop_that_exits_after_its_first_batch_is_not_a_training_loop():
    # GunhoChoi/PyTorch-FastCampus GradCAM: ``for image, label in test_loader: ...; break``
    assert _one_batch() == []
    assert _one_batch(exit="raise SystemExit") == []


def test_one_batch_loop_inside_an_epoch_loop_still_fires():
    assert _one_batch(outer="for epoch in range(3):") == [("TGL102", 10), ("TGL001", 11), ("TGL101", 12)]


def test_loop_whose_exit_a_continue_or_a_condition_can_skip_still_fires():
    assert _one_batch(skip="if x is None: continue") == [("TGL102", 9), ("TGL001", 10), ("TGL101", 11)]
    assert _one_batch(exit="if len(losses) > 3: break") == [("TGL102", 9), ("TGL001", 10), ("TGL101", 11)]


# -- a notebook that redefines a class in a later cell ----------------------------------------------
def test_model_built_before_a_class_is_redefined_is_judged_by_the_earlier_definition():
    # udacity/deep-learning-v2-pytorch "Part 5 - Inference and Validation": a plain MLP validated
    # under no_grad in training mode, then ``class Classifier`` redefined with dropout (and eval())
    # only the second model (the class with dropout, built after it is redefined) is reported
    assert codes(_REDEFINED) == [("TGL201", 39)]


_REDEFINED = """# %% cell 1
import torch
from torch import nn, optim
import torch.nn.functional as F
# %% cell 2
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 10)
    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)
# %% cell 3
model = Classifier()
optimizer = optim.Adam(model.parameters())
for images, labels in trainloader:
    optimizer.zero_grad()
    F.nll_loss(model(images), labels).backward()
    optimizer.step()
    with torch.no_grad():
        ps = model(test_images)
# %% cell 4
class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 64)
        self.fc2 = nn.Linear(64, 10)
        self.dropout = nn.Dropout(p=0.2)
    def forward(self, x):
        return F.log_softmax(self.fc2(self.dropout(F.relu(self.fc1(x)))), dim=1)
# %% cell 5
model = Classifier()
optimizer = optim.Adam(model.parameters())
for images, labels in trainloader:
    optimizer.zero_grad()
    F.nll_loss(model(images), labels).backward()
    optimizer.step()
    with torch.no_grad():
        ps = model(test_images)
"""


def test_top_level_call_runs_the_function_defined_before_it():
    # deep-learning-with-pytorch/dlwpt-code p1ch8: ``def validate(model, ...)`` in one cell is called
    # there on a plain CNN; a later cell redefines ``validate`` and calls it on a model with dropout
    src = """# %% cell 1
import torch
from torch import nn
def training_loop(model, optimizer):
    for x, y in loader:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
# %% cell 2
model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
training_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
def validate(model):
    with torch.no_grad():
        return [model(x) for x, _ in val_loader]
validate(model)
# %% cell 3
def validate(model):
    with torch.no_grad():
        return [model(x) for x, _ in val_loader]
model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.4), nn.Linear(4, 2))
training_loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
validate(model)
"""
    assert codes(src) == [("TGL201", 19)]


# -- a sixth review round (2026-11-24) ------------------------------------------------------------
_SAC = """
import torch
import torch.nn as nn


class Actor(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(d, d), nn.ReLU(), {layer})

    def forward(self, state, deterministic=False):
        return self.trunk(state)

    @torch.no_grad()
    def act(self, state):
        deterministic = not self.training
        return self(state, deterministic=deterministic)


class SACN:
    def __init__(self, actor: Actor, actor_optimizer):
        self.actor = actor
        self.actor_optimizer = actor_optimizer

    def _target(self, next_state):
        with torch.no_grad():
            return self.actor(next_state)

    def update(self, state, next_state):
        loss = self.actor(state).pow(2).mean()
        self.actor_optimizer.zero_grad()
        loss.backward()
        self.actor_optimizer.step()
        return self._target(next_state)


actor = Actor(4)
trainer = SACN(actor=actor, actor_optimizer=torch.optim.Adam(actor.parameters()))
for state, next_state in loader:
    trainer.update(state, next_state)
"""


def test_module_from_a_constructor_parameter_is_judged_by_its_annotated_class():
    # tinkoff-ai/CORL sac_n.py, edac.py, lb_sac.py: ``self.actor = actor`` with ``actor: Actor``, a
    # policy of linear layers whose ``act()`` (not its forward) reads ``self.training``
    assert codes(_SAC.format(layer="nn.Linear(d, d)")) == []


def test_module_from_a_constructor_parameter_is_judged_by_the_name_the_construction_passes():
    # navneet-nmk/pytorch-rl's EmpowermentTrainer: no annotation, ``forward_dynamics=net`` with
    # ``net = Dynamics(...)`` bound just before the construction
    src = _SAC.replace("def __init__(self, actor: Actor, actor_optimizer):",
                       "def __init__(self, actor, actor_optimizer):")
    assert codes(src.format(layer="nn.Linear(d, d)")) == []
    assert codes(src.format(layer="nn.Dropout(0.1)")) == [("TGL201", 27)]


def test_module_from_a_constructor_parameter_with_dropout_still_fires():
    assert codes(_SAC.format(layer="nn.Dropout(0.1)")) == [("TGL201", 27)]


def test_training_flag_read_in_a_method_the_forward_calls_still_counts():
    src = _SAC.format(layer="nn.Linear(d, d)").replace(
        "return self.trunk(state)", "return self.trunk(state) if self.pick() else state").replace(
        "    @torch.no_grad()\n    def act(", "    def pick(self):\n        return self.training\n\n"
        "    @torch.no_grad()\n    def act(")
    assert codes(src) == [("TGL201", 30)]


_CRITIC = """
import torch
import torch.nn as nn

d, layernorm = 4, True
critic = nn.Sequential(nn.Linear(d, d), {norm}, nn.ReLU(), nn.Linear(d, 1))
opt = torch.optim.Adam(critic.parameters())
for x, y in loader:
    opt.zero_grad()
    (critic(x) - y).pow(2).mean().backward()
    opt.step()
    with torch.no_grad():
        q = critic(x_val)
"""


def test_conditional_layer_is_judged_by_both_branches():
    # CORL lb_sac.py: ``nn.LayerNorm(h) if layernorm else nn.Identity()``; modded-nanogpt:
    # ``CausalSelfAttention(d, h) if use_attn else None``
    assert codes(_CRITIC.format(norm="nn.LayerNorm(d) if layernorm else nn.Identity()")) == []
    assert codes(_CRITIC.format(norm="nn.LayerNorm(d) if layernorm else None")) == []


def test_conditional_layer_with_dropout_in_one_branch_still_fires():
    assert codes(_CRITIC.format(norm="nn.LayerNorm(d) if layernorm else nn.Dropout(0.1)")) == [("TGL201", 13)]


_DDP = """
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

model = nn.Sequential(nn.Linear(4, 4), {layer}, nn.Linear(4, 2))
model = torch.compile(model)
ddp_model = DDP(model, device_ids=[0], broadcast_buffers=False)
opt = torch.optim.Adam(model.parameters())
for step in range(100):
    if step % 10 == 0:
        {switch}
        with torch.no_grad():
            val_loss = ddp_model(x_val).sum()
        model.train()
    opt.zero_grad()
    ddp_model(x).sum().backward()
    opt.step()
"""


def test_wrapper_with_arguments_runs_the_module_it_wraps():
    # modded-nanogpt: ``ddp_model = DDP(model, device_ids=[...], ...)``; ``model.eval()`` before the
    # validation that runs ``ddp_model``; the wrapper is as mode-free as the module
    assert codes(_DDP.format(layer="nn.Dropout(0.1)", switch="model.eval()")) == []
    assert codes(_DDP.format(layer="nn.ReLU()", switch="pass")) == []


def test_wrapper_of_a_module_with_dropout_never_switched_still_fires():
    assert codes(_DDP.format(layer="nn.Dropout(0.1)", switch="pass")) == [("TGL201", 14)]


_ITEM_IF_TENSOR = """
import torch
import torch.nn.functional as F
for epoch in range(10):
    total = 0.0
    for x, y in loader:
        aux = 0.0
        if old_model is not None:
            aux = F.mse_loss(model(x), old_model(x).detach())
        loss = F.cross_entropy(model(x), y) + aux
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += {kept}
"""


def test_item_of_a_value_or_the_value_itself_is_detached():
    # G-U-N/PyCIL podnet.py: ``flat_losses += flat_loss.item() if self._cur_task != 0 else flat_loss``
    assert codes(_ITEM_IF_TENSOR.format(kept="aux.item() if old_model is not None else aux")) == []
    assert codes(_ITEM_IF_TENSOR.format(kept="aux if isinstance(aux, float) else aux.item()")) == []


def test_conditional_that_keeps_a_different_tensor_still_fires():
    assert codes(_ITEM_IF_TENSOR.format(kept="aux.item() if old_model is not None else loss")) == [("TGL101", 14)]


_RESTORING_HELPER = """
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.fc(self.drop(x))


def perturb(net, x_nat):
    net.eval()
    x = x_nat.detach()
    for _ in range(10):
        x.requires_grad_()
        with torch.enable_grad():
            loss = net(x).sum()
        x = x.detach() + 0.1 * torch.autograd.grad(loss, [x])[0].sign()
    {restore}
    return x


def evaluate(model, loader):
    model.eval()
    with torch.no_grad():
        for data, target in loader:
            output = model(perturb(net=model, x_nat=data))


def main(loader):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        model.train()
        for data, target in loader:
            opt.zero_grad()
            model(data).sum().backward()
            opt.step()
        evaluate(model, loader)
"""


def test_helper_that_hands_the_module_back_in_training_mode_fires_in_an_evaluation():
    # yaodongyu/TRADES train_trades_mnist_binary.py: ``perturb_logistic`` ends with ``net.train()``
    # for the training loop; ``eval_adv_test`` calls it under ``no_grad`` and then runs the model
    assert codes(_RESTORING_HELPER.format(restore="net.train()")) == [("TGL201", 32)]


def test_helper_that_leaves_the_module_in_eval_mode_is_silent():
    assert codes(_RESTORING_HELPER.format(restore="pass")) == []


def test_train_switch_of_a_helper_that_never_switched_to_eval_stays_unknown():
    # ``net.train()`` under no_grad with no ``net.eval()`` before it in the helper: no restore
    src = _RESTORING_HELPER.format(restore="net.train()").replace("    net.eval()\n", "")
    assert codes(src) == []


_DGL_EVAL = """
import dgl
import dgl.function as fn
import torch
import torch.nn as nn
import torch.nn.functional as F
from dgl.nn import {conv}

class GCN(nn.Module):
    def __init__(self, in_feats, h_feats, num_classes):
        super().__init__()
        self.conv1 = {conv}(in_feats, h_feats{extra})
        self.conv2 = {conv}(h_feats, num_classes{extra})

    def forward(self, g, in_feat):
        h = F.relu(self.conv1(g, in_feat))
        h = self.conv2(g, h)
        g.ndata["h"] = h
        return dgl.mean_nodes(g, "h")

class DotPredictor(nn.Module):
    def forward(self, g, h):
        with g.local_scope():
            g.ndata["h"] = h
            g.apply_edges(fn.u_dot_v("h", "h", "score"))
            return g.edata["score"][:, 0]

model = GCN(5, 16, 2)
pred = DotPredictor()
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
for batched_graph, labels in train_dataloader:
    loss = F.cross_entropy(model(batched_graph, batched_graph.ndata["attr"].float()), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
with torch.no_grad():
    scores = pred(g, h)
for batched_graph, labels in test_dataloader:
    out = model(batched_graph, batched_graph.ndata["attr"].float())
"""


@pytest.mark.parametrize("conv, extra, expect", [
    ("GraphConv", "", []),  # dmlc/dgl's blitz tutorials: graph convolutions and readouts, no mode
    ("GATConv", ", 1, feat_drop=0.5", [("TGL201", 38)]),  # a layer the linter does not know
])
def test_dgl_graph_convolutions_readouts_and_message_functions_are_mode_free(conv, extra, expect):
    assert codes(_DGL_EVAL.format(conv=conv, extra=extra)) == expect


# -- eleventh review round (course notebooks, research scripts) ----------------------------------
@pytest.mark.parametrize("rnn, expect", [
    # a sampling method's progress bar is no layer (DTU's RNN language model)
    ("nn.LSTM(5, 5, num_layers=1, batch_first=True)", []),
    ("nn.LSTM(5, 5, num_layers=2, dropout=0.3)", [("TGL201", 23)]),
])
def test_utility_library_in_a_method_is_no_layer(rnn, expect):
    assert codes(f"""
        import torch
        from torch import nn
        from tqdm import tqdm

        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = {rnn}
                self.proj = nn.Linear(5, 7)
            def forward(self, x):
                return self.proj(self.rnn(x)[0])
            def sample(self, n):
                return [self.forward(t) for t in tqdm(range(n))]

        lm = LM()
        opt = torch.optim.AdamW(lm.parameters())
        for x, y in loader:
            opt.zero_grad()
            loss_fn(lm(x), y).backward()
            opt.step()
        with torch.no_grad():
            out = lm.sample(10)
        """) == expect


@pytest.mark.parametrize("value, expect", [
    ("Loss.v", []),  # a hand-written autograd value: ``.v`` is no tensor attribute (DTU's Nanograd)
    ("Loss.T", [("TGL101", 10)]),  # a tensor's transpose keeps the graph
])
def test_attribute_that_no_tensor_has_of_a_backpropagated_value(value, expect):
    assert codes(f"""
        import torch
        train_loss = []
        for e in range(100):
            Loss = squared_loss(y_train, forward(x_train, NN))
            Loss.backward()
            update_parameters(NN)
            zero_gradients(NN)
            Loss_validation = squared_loss(y_validation, forward(x_validation, NN))
            train_loss.append({value})
        """) == expect


_HIGHER = """
import higher
import torch
import torch.nn.functional as F

for i in range(iters):
    optimizer.zero_grad()
    with higher.innerloop_ctx(model, optimizer, copy_initial_weights=False) as (inner_model, inner_optimizer):
        for _ in range(inner_iters):
            loss_inner = 0
            for x_s, y_s in support:
                loss_inner += F.cross_entropy(inner_model(x_s), y_s)
            inner_optimizer.step({arg})
        loss_outer = F.cross_entropy(inner_model(x_q), y_q)
    loss_outer.backward()
    optimizer.step()
"""


@pytest.mark.parametrize("arg, expect", [
    # ``higher``'s differentiable optimizer takes the loss and its gradients (thuml's MLDG)
    ("loss_inner", []),
    # a torch optimizer's step takes a closure; the summed losses are then never backpropagated
    ("closure", [("TGL101", 12), ("TGL001", 13)]),
])
def test_differentiable_optimizer_step_takes_the_loss(arg, expect):
    assert codes(_HIGHER.format(arg=arg)) == expect


_RETURNS_ITS_ARGUMENT = """
import copy
import torch
from torch import nn

class DigitNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 10){extra}
    def forward(self, x):
        return self.fc(x)

def train(model, epochs=300):
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(epochs):
        opt.zero_grad()
        loss_fn(model(X), y).backward()
        opt.step()
    return model

def prune_model(base, amount):
    m = copy.deepcopy(base)
    prune(m, amount)
    return m

def accuracy(model):
    with torch.no_grad():
        return (model(X_te).argmax(1) == y_te).float().mean().item()

model = train(DigitNet())
print(accuracy(model))
pruned = prune_model(model, 0.9)
opt = torch.optim.Adam(pruned.parameters(), lr=1e-3)
for _ in range(500):
    opt.zero_grad()
    loss_fn(pruned(X), y).backward()
    opt.step()
print(accuracy(pruned))
"""


@pytest.mark.parametrize("extra, expect", [
    ("", []),  # a helper hands back (a copy of) the module it was given: jeffheaton's pruning notebook
    ("\n        self.drop = nn.Dropout(0.5)", [("TGL201", 29)]),
])
def test_factory_that_returns_its_argument_is_judged_by_the_argument(extra, expect):
    assert codes(_RETURNS_ITS_ARGUMENT.format(extra=extra)) == expect


_GLOBAL_REBOUND = """
import torch
from torch import nn
from torchvision import models

model = models.resnet18(weights="DEFAULT")
train(model)

model = nn.Sequential(nn.Linear(3, 32), nn.ReLU(), nn.Linear(32, 1){extra})
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
for _ in range(400):
    opt.zero_grad()
    loss_fn(model(X), yt).backward()
    opt.step()

def accuracy(data):
    with torch.no_grad():
        return ((torch.sigmoid(model(data)) >= 0.5).float() == yt).float().mean().item()

def perm_importance(cols):
    return base - accuracy(shuffled(cols))

base = accuracy(X)
individual = [perm_importance([j]) for j in range(3)]
"""


@pytest.mark.parametrize("extra, expect", [
    # the function reads the global ``model`` a later cell rebinds to a mode-free net before calling it
    ("", []),
    (", nn.Dropout(0.2)", [("TGL201", 18)]),
])
def test_global_module_read_in_a_function_is_what_reaches_its_callers(extra, expect):
    assert codes(_GLOBAL_REBOUND.format(extra=extra)) == expect


@pytest.mark.parametrize("wrap", ["torch.compile(model, backend='aot_eager')", "model"])
def test_compiled_softmax_model_into_cross_entropy(wrap):
    # jeffheaton's k-fold notebook compiles a model that ends in ``nn.Softmax``
    assert codes(f"""
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(4, 25), nn.ReLU(), nn.Linear(25, 3), nn.Softmax(dim=1))
        model = {wrap}
        criterion = nn.CrossEntropyLoss()
        for epoch in range(100):
            optimizer.zero_grad()
            output = model(x_train)
            loss = criterion(output, y_train)
            loss.backward()
            optimizer.step()
        """) == [("TGL303", 10)]


@pytest.mark.parametrize("params, expect", [
    # a distribution of constants holds no graph: nothing before the loop needs retaining (DTU's RealNVP)
    ("torch.zeros(2), torch.ones(2)", [("TGL102", 10)]),
    ("mu_net(h), torch.ones(2)", []),  # its mean computed before the loop: every iteration goes through it
])
def test_retained_graph_through_a_distribution_built_before_the_loop(params, expect):
    assert codes(f"""
        import torch
        from torch.distributions import Normal
        base = Normal({params})
        losses = []
        for epoch in range(2500):
            z, log_det_J = model(x)
            loss = -torch.mean(base.log_prob(z) + log_det_J)
            optimizer.zero_grad()
            loss.backward(retain_graph=True)
            optimizer.step()
            losses.append(loss.item())
        """) == expect


@pytest.mark.parametrize("forward, expect", [
    # a throwaway container built in forward registers nothing (Mastering PyTorch's pix2pix blocks)
    ("nn.Sequential(*self.layers)(x)", [("TGL006", 8)]),
    ("self.body(x)", []),
])
def test_list_wrapped_in_a_sequential_per_call_is_not_registered(forward, expect):
    init_body = "self.body = nn.Sequential(*self.layers)" if forward == "self.body(x)" else "pass"
    assert codes(f"""
        import torch
        from torch import nn

        class DownConvBlock(nn.Module):
            def __init__(self, ip_sz, op_sz):
                super().__init__()
                self.layers = [nn.Conv2d(ip_sz, op_sz, 4, 2, 1), nn.LeakyReLU(0.2)]
                {init_body}
            def forward(self, x):
                return {forward}
        """) == expect


@pytest.mark.parametrize("call, expect", [
    ("nn.Dropout(0.25)(h)", [("TGL203", 12)]),  # Mastering PyTorch's music LSTM
    # a policy network that assembles its Sequential per call (Deep Learning with PyTorch 1.x)
    ("nn.Sequential(self.enc, nn.Dropout(p=0.5), nn.ReLU())(x)", [("TGL203", 12)]),
    ("nn.Dropout(0.0)(h)", []),
    ("self.drop(h)", []),
    ("self._lazy(h)", []),  # kept on the module the first time: ``.eval()`` reaches it
])
def test_dropout_module_built_and_called_in_forward(call, expect):
    assert codes(f"""
        import torch
        from torch import nn

        class MusicLSTM(nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = nn.Linear(4, 8)
                self.drop = nn.Dropout(0.25)
            def forward(self, x):
                h = self.enc(x)
                return {call}
            def _lazy(self, h):
                if not hasattr(self, "late"):
                    self.late = nn.Dropout(0.3)
                return self.late(h)
        """) == expect


@pytest.mark.parametrize("rate, expect", [
    ("0.3", [("TGL201", 16)]),  # a recurrent dropout of 0.3 is no zero rate (``0.`` then ``3``)
    ("0.0", []),
    ("0", []),
])
def test_nonzero_recurrent_dropout_rate_is_mode_sensitive(rate, expect):
    assert codes(f"""
        import torch
        from torch import nn

        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.LSTM(5, 5, num_layers=2, dropout={rate})
            def forward(self, x):
                return self.rnn(x)[0]

        lm = LM()
        for x, y in loader:
            opt.zero_grad(); loss_fn(lm(x), y).backward(); opt.step()
        with torch.no_grad():
            out = lm(z)
        """) == expect


@pytest.mark.parametrize("call, expect", [
    ("model(test[0])", []),  # DSKSD's CNN: the rate only builds the dropout its forward gates off
    ("model(test[0], is_training=True)", [("TGL201", 21)]),
])
def test_gated_dropout_rate_parameter_is_not_a_layer(call, expect):
    assert codes(f"""
        import torch
        from torch import nn

        class CNNClassifier(nn.Module):
            def __init__(self, vocab_size, output_size, dropout=0.5):
                super().__init__()
                self.embedding = nn.Embedding(vocab_size, 16)
                self.dropout = nn.Dropout(dropout)
                self.fc = nn.Linear(16, output_size)
            def forward(self, inputs, is_training=False):
                h = self.embedding(inputs).mean(1)
                if is_training:
                    h = self.dropout(h)
                return self.fc(h)

        model = CNNClassifier(100, 2)
        for x, y in loader:
            opt.zero_grad(); loss_fn(model(x, True), y).backward(); opt.step()
        accuracy = 0
        for test in test_data:
            pred = {call}.max(1)[1]
        """) == expect


_METER = """
import torch
{imports}

def train(model, loader, optimizer, criterion, epoch):
    losses = AverageMeter('Loss', ':.4e')
    for i, (images, target) in enumerate(loader):
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.update({value}, images.size(0))
    return losses.avg
"""

_SAME_FILE_METER = """
class AverageMeter:
    def __init__(self, name, fmt=':f'):
        self.name, self.fmt = name, fmt
        self.sum, self.count = 0, 0

    def update(self, val, n=1):
        self.val = val
        self.sum += {added} * n
        self.count += n
"""


@pytest.mark.parametrize("imports, value, expect", [
    # a loss tensor into the idiom's running sum keeps every step's graph (thuml's keypoint examples)
    ("from timm.utils import AverageMeter", "loss", [("TGL101", 12)]),
    ("from timm.utils import AverageMeter", "loss.item()", []),
    (_SAME_FILE_METER.format(added="val"), "loss", [("TGL101", 22)]),
    (_SAME_FILE_METER.format(added="float(val)"), "loss", []),  # the meter converts what it is given
])
def test_loss_tensor_into_a_running_average_meter(imports, value, expect):
    assert codes(_METER.format(imports=imports, value=value)) == expect


def test_meter_from_elsewhere_not_named_like_the_idiom_is_silent():
    # tllib's ``Meter`` keeps only the latest value; outside the project its body cannot be read
    src = _METER.format(imports="from utils import Meter", value="loss").replace("AverageMeter(", "Meter(")
    assert codes(src) == []


@pytest.mark.parametrize("loop, expect", [
    # rows of a softmax output walked by a loop, then ``log`` of a detached element (sgugger's LM notebooks)
    ("for i, pv in enumerate(p_vocab):", [("TGL303", 9)]),
    ("for pv, t in zip(p_vocab, targets):", [("TGL303", 9)]),
    ("for i, pv in enumerate(scores):", []),  # the raw scores: no probabilities
])
def test_log_of_softmax_rows_walked_by_a_loop(loop, expect):
    src = f"""
        import torch
        import torch.nn.functional as F
        total_loss = 0.
        for inputs, targets in data_source:
            scores = model(inputs)
            p_vocab = F.softmax(scores, 1)
            {loop}
                total_loss -= torch.log(pv[targets[0]].detach())
        """
    assert codes(src) == expect


@pytest.mark.parametrize("guard, expect", [
    # the eval runs in the last iteration only; the next epoch starts with ``model.train()`` (jeffheaton's CNN)
    ("if i == len(steps) - 1:", []),
    ("if i + 1 == len(steps):", []),
    ("if i % 100 == 0:", [("TGL202", 16)]),  # mid-epoch: the next iterations train in eval mode
])
def test_eval_in_the_last_iteration_of_the_batch_loop(guard, expect):
    src = f"""
        import torch
        from torch import nn
        from tqdm import tqdm
        model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 2))
        epoch = 0
        while epoch < 100:
            epoch += 1
            steps = list(enumerate(train_loader))
            pbar = tqdm(steps)
            model.train()
            for i, (x, y) in pbar:
                loss = loss_fn(model(x), y)
                optimizer.zero_grad(); loss.backward(); optimizer.step()
                {guard}
                    model.eval()
                    vloss = validate(model, validation_loader)
        """
    assert codes(src) == expect


@pytest.mark.parametrize("call, expect", [
    # the backward runs only ``if opt is not None``; the no-grad path never passes one (PyTorch CV Cookbook)
    ("loss_epoch(model, loss_func, val_dl)", []),
    ("loss_epoch(model, loss_func, val_dl, opt=None)", []),
    ("loss_epoch(model, loss_func, val_dl, opt)", [("TGL002", 12)]),  # a step under no_grad: it raises
])
def test_backward_gated_on_a_parameter_no_caller_passes(call, expect):
    src = f"""
        import torch
        from torch import nn

        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def loss_batch(loss_func, output, target, opt=None):
            loss = loss_func(output, target)
            if opt is not None:
                opt.zero_grad()
                loss.backward()
                opt.step()
            return loss.item()

        def loss_epoch(model, loss_func, dataset_dl, opt=None):
            running = 0.0
            for xb, yb in dataset_dl:
                running += loss_batch(loss_func, model(xb), yb, opt)
            return running

        with torch.no_grad():
            val_loss = {call}
        """
    assert codes(src) == expect


@pytest.mark.parametrize("head, expect", [
    # ``probs, value = self.predict(s)`` where ``predict`` returns the actor-critic model's output
    ("F.softmax(self.action(x), dim=-1)", [("TGL303", 24)]),  # the RL Cookbook's actor-critic agents
    ("F.log_softmax(self.action(x), dim=-1)", []),
])
def test_tuple_element_returned_through_a_wrapper_method(head, expect):
    assert codes(f"""
        import torch
        import torch.nn.functional as F
        from torch import nn

        class ActorCriticModel(nn.Module):
            def __init__(self, n_input, n_output, n_hidden):
                super().__init__()
                self.fc = nn.Linear(n_input, n_hidden)
                self.action = nn.Linear(n_hidden, n_output)
                self.value = nn.Linear(n_hidden, 1)
            def forward(self, x):
                x = F.relu(self.fc(x))
                return {head}, self.value(x)

        class PolicyNetwork:
            def __init__(self, n_state, n_action):
                self.model = ActorCriticModel(n_state, n_action, 50)
            def predict(self, s):
                return self.model(torch.Tensor(s))
            def get_action(self, s):
                action_probs, state_value = self.predict(s)
                action = torch.multinomial(action_probs, 1).item()
                log_prob = torch.log(action_probs[action])
                return action, log_prob, state_value
        """) == expect


@pytest.mark.parametrize("build, expect", [
    # a model class of another package with its own ``generate`` (mamba.py's MambaLM), in a file
    # that also imports transformers for the tokenizer
    ("from mambapy.lm import MambaLM\nmodel = MambaLM(config).to(device)", []),
    ("from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained(name)\n"
     "model.train()", [("TGL201", 15)]),
])
def test_generate_of_a_model_from_another_library(build, expect):
    src = """
import torch
from transformers import AutoTokenizer
{build}
tokenizer = AutoTokenizer.from_pretrained(name)
optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
for batch in loader:
    optim.zero_grad()
    loss = model(batch).loss
    loss.backward()
    optim.step()
output = model.generate(tokenizer, "She was", num_tokens=50)
"""
    found = codes(src.format(build=build))
    assert [c for c, _ in found] == [c for c, _ in expect]


@pytest.mark.parametrize("use, expect", [
    # a batch-norm recalibration pass whose output name the evaluation loop after it binds again
    # before reading it (SDPoint's validate): the pass's own outputs are never read
    ("pass", []),
    ("acc += (output.argmax(1) == target).sum().item()", [("TGL201", 11)]),  # read: an evaluation
])
def test_statistics_pass_whose_output_name_is_reused_later(use, expect):
    assert codes(f"""
        import torch
        from torch import nn

        def validate(train_loader, val_loader, model, criterion):
            model.train()
            acc = 0
            with torch.no_grad():
                for i, (input, target) in enumerate(train_loader):
                    input = input.cuda()
                    output = model(input)
                    {use}
            model.eval()
            with torch.no_grad():
                for i, (input, target) in enumerate(val_loader):
                    output = model(input)
                    loss = criterion(output, target)
            return loss

        model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        validate(train_loader, val_loader, model, criterion)
        """) == expect
