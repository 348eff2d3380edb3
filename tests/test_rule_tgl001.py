"""TGL001 missing-zero-grad on short snippets the fixtures do not cover."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.missing_zero_grad import MissingZeroGrad

from rule_snippets import SIMPLE_LOSS_COMPUTE


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
    "for p in model.parameters(): p._grad = None",  # the slot ``.grad`` reads
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


# Gradients handed to a shared model by reference (A3C workers): the shared optimizer's
# zero_grad() sets the shared gradients to None (PyTorch >= 2.0) and never resets the local ones.
_WORKER = """
    import torch

    def push(opt, lnet, gnet, loss):
        opt.zero_grad({flag})
        {local_reset}
        loss.backward()
        for lp, gp in zip(lnet.parameters(), gnet.parameters()):
            gp.{attr} = {value}
        opt.step()
        lnet.load_state_dict(gnet.state_dict())
    """


def _worker(flag: str = "", local_reset: str = "pass", attr: str = "_grad", value: str = "lp.grad") -> list[int]:
    return lines(_WORKER.format(flag=flag, local_reset=local_reset, attr=attr, value=value))


def test_gradients_handed_over_by_reference_and_never_reset_are_flagged():
    assert _worker() == [10]
    assert _worker(attr="grad") == [10]  # ``gp.grad = lp.grad`` is the same handoff, not a reset
    assert _worker(value="lp._grad") == [10]


@pytest.mark.parametrize("kwargs", [
    {"flag": "set_to_none=False"},  # zeroed in place: the local tensors too
    {"flag": "False"},
    {"local_reset": "lnet.zero_grad()"},
    {"local_reset": "for p in lnet.parameters(): p.grad = None"},
    {"value": "lp.grad.clone()"},  # a copy is not a handoff by reference
])
def test_gradients_handed_over_near_misses_are_silent(kwargs):
    assert _worker(**kwargs) == []


def test_handoff_through_a_helper_is_named_at_the_step():
    src = """
        import torch

        def ensure_shared_grads(model, shared_model):
            for param, shared_param in zip(model.parameters(), shared_model.parameters()):
                if shared_param.grad is not None:
                    return
                shared_param._grad = param.grad

        def train(shared_model, optimizer, make, batches):
            model = make()
            while True:
                model.load_state_dict(shared_model.state_dict())
                loss = model(next(batches)).sum()
                optimizer.zero_grad()
                loss.backward()
                ensure_shared_grads(model, shared_model)
                optimizer.step()
        """
    result = lint_source(textwrap.dedent(src), "x.py", [MissingZeroGrad])
    [d] = result.diagnostics
    assert d.line == 18
    assert d.message == "`optimizer` steps `model`'s gradients, handed to `shared_model` by reference and never reset"
    assert "ensure_shared_grads(model, shared_model)" in d.detail and "`model.zero_grad()`" in d.detail


def test_handoff_of_a_local_model_built_every_iteration_is_silent():
    assert lines("""
        import torch
        for batch in loader:
            lnet = Net()
            lnet.load_state_dict(gnet.state_dict())
            opt.zero_grad()
            lnet(batch).sum().backward()
            for lp, gp in zip(lnet.parameters(), gnet.parameters()):
                gp._grad = lp.grad
            opt.step()
        """) == []


def test_handoff_in_a_step_function_whose_caller_resets_the_local_model_is_silent():
    assert lines("""
        import torch

        def push(opt, lnet, gnet, loss):
            opt.zero_grad()
            loss.backward()
            for lp, gp in zip(lnet.parameters(), gnet.parameters()):
                gp._grad = lp.grad
            opt.step()

        for batch in loader:
            local.zero_grad()
            push(opt, local, shared, local(batch).sum())
        """) == []


def test_two_handoffs_each_step_named_by_its_own_handoff():
    src = """
        import torch
        for batch in loader:
            opt_a.zero_grad()
            opt_b.zero_grad()
            (agent(batch).sum() + icm(batch).sum()).backward()
            for lp, gp in zip(agent.parameters(), shared_agent.parameters()):
                gp._grad = lp.grad
            opt_a.step()
            for lp, gp in zip(icm.parameters(), shared_icm.parameters()):
                gp._grad = lp.grad
            opt_b.step()
        """
    result = lint_source(textwrap.dedent(src), "x.py", [MissingZeroGrad])
    assert [(d.line, d.message.split("`")[3]) for d in result.diagnostics] == [(9, "agent"), (12, "icm")]


def test_a_method_called_on_an_instance_of_a_same_file_class_is_the_step():
    """``agent = Agent(...)`` then ``agent.update(batch)`` in the loop: the method backpropagates and
    steps without a reset (resolved through the instance's class, also ``self.agent``)."""
    src = """
        import torch

        class Agent:
            def __init__(self, net):
                self.net = net
                self.opt = torch.optim.Adam(net.parameters())

            def update(self, batch):
                loss = self.net(batch).sum()
                loss.backward()
                self.opt.step()

        class Runner:
            def __init__(self, net):
                self.agent = Agent(net)

            def run(self, loader):
                for batch in loader:
                    self.agent.update(batch)

        agent = Agent(net)
        for batch in loader:
            agent.update(batch)
        other = make_agent()
        for batch in loader:
            other.update(batch)
        """
    assert lines(src) == [20, 24]


def test_an_ema_object_named_like_an_optimizer_is_no_optimizer():
    """MixMatch's ``ema_optimizer = WeightEMA(model, ema_model)``: its ``step`` averages weights and
    reads no gradient; a same-file optimizer class whose ``step`` reads ``p.grad`` still steps."""
    src = """
        import torch

        class WeightEMA:
            def __init__(self, model, ema_model):
                self.params = list(model.state_dict().values())
                self.ema_params = list(ema_model.state_dict().values())

            def step(self):
                for p, e in zip(self.params, self.ema_params):
                    e.mul_(0.999).add_(p * 0.001)

        class PlainSGD:
            def __init__(self, params):
                self.params = list(params)

            def step(self):
                for p in self.params:
                    p.data.add_(p.grad, alpha=-0.1)

        ema_optimizer = WeightEMA(model, ema_model)
        sgd_optimizer = PlainSGD(model.parameters())
        for x in loader:
            optimizer.zero_grad()
            model(x).sum().backward()
            optimizer.step()
            ema_optimizer.step()
        for x in loader:
            model(x).sum().backward()
            sgd_optimizer.step()
        """
    assert lines(src) == [30]


def test_an_ema_object_passed_to_the_training_function_is_no_optimizer():
    """MixMatch's ``train(..., optimizer, ema_optimizer, ...)``: the parameter's same-file callers
    all pass a ``WeightEMA``."""
    src = """
        import torch

        class WeightEMA:
            def step(self):
                self.ema.mul_(0.999)

        def train(loader, model, optimizer, ema_optimizer):
            for x in loader:
                optimizer.zero_grad()
                model(x).sum().backward()
                optimizer.step()
                ema_optimizer.step()

        def main():
            ema_optimizer = WeightEMA()
            train(loader, model, torch.optim.Adam(model.parameters()), ema_optimizer)
        """
    assert lines(src) == []
    assert lines(src.replace("ema_optimizer = WeightEMA()", "ema_optimizer = make_ema()")) == [13]


ENGINE = """
import torch
from ignite.engine import Engine
model = torch.nn.Linear(2, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def update_fn(engine, batch):
    model.train()
    {reset}
    loss = model(batch).sum()
    loss.backward()
    optimizer.step()
    return loss.item()

trainer = Engine({handed})
trainer.run(loader, max_epochs=2)
"""


def test_a_step_function_run_by_an_ignite_engine_must_reset_its_gradients():
    # pytorch/ignite's EfficientNet fine-tuning notebook: ``update_fn`` never calls zero_grad
    assert lines(ENGINE.format(reset="", handed="update_fn")) == [12]
    assert lines(ENGINE.format(reset="", handed="process_function=update_fn")) == [12]
    assert lines(ENGINE.format(reset="optimizer.zero_grad()", handed="update_fn")) == []
    assert lines(ENGINE.format(reset="", handed="other_fn")) == []  # not the engine's step: its callers' job


def test_a_helper_steps_the_optimizer_its_caller_passes():
    # a GAN loop that resets ``opt_d`` and calls one step helper for both networks: only the call
    # that passes ``opt_g`` (never reset) is reported, and the message names it
    source = """
    import torch
    G = torch.nn.Linear(2, 2)
    D = torch.nn.Linear(2, 1)
    opt_g = torch.optim.Adam(G.parameters())
    opt_d = torch.optim.Adam(D.parameters())

    def step(model, x, optimizer):
        loss = model(x).sum()
        loss.backward()
        optimizer.step()

    for x in loader:
        opt_d.zero_grad()
        step(D, x, opt_d)
        step(G, x, optimizer=opt_g)
    """
    found = lint_source(textwrap.dedent(source), "x.py", [MissingZeroGrad]).diagnostics
    assert [(d.line, "`opt_g`" in d.message) for d in found] == [(16, True)]


def test_a_closure_over_a_factory_parameter_may_step_the_loops_optimizer():
    # open_clip: ``train_step = make_step(task, optimizer)`` closes over the factory's parameter; the
    # loop zeroes ``optimizer`` (bound to ``state.optimizer``) before each call
    assert lines("""
    def make_step(model, optimizer):
        def train_step(batch):
            model(batch).sum().backward()
            optimizer.step()
        return train_step

    def train_one_epoch(state, loader):
        optimizer = state.optimizer
        train_step = make_step(state.model, optimizer)
        for batch in loader:
            optimizer.zero_grad()
            train_step(batch)
    """) == []


_STAGES = """
import torch

for stage in range(3):
    m = Head(stage).to(device)
    opt = torch.optim.Adam(m.parameters(), 1e-3)
    for x, y in loader:
        loss = ((m(x) - y) ** 2).mean()
        {reset}
        loss.backward()
        opt.step()
    opt = torch.optim.Adam(ensemble.parameters(), 1e-3)
    for x, y in loader:
        opt.zero_grad()
        ensemble(x).sum().backward()
        opt.step()
"""


def test_the_optimizer_bound_where_it_steps_decides_what_a_module_reset_covers():
    # yandex-research's GrowNet: each boosting stage trains a new ``m`` with ``opt`` over its parameters
    # (``m.zero_grad()``), then rebinds ``opt`` to the ensemble's optimizer for the corrective step
    from torchgradlint.engine import lint_source
    from torchgradlint.rules.missing_zero_grad import MissingZeroGrad

    def found(reset):
        src = _STAGES.format(reset=reset)
        return [d.line for d in lint_source(src, "x.py", [MissingZeroGrad]).diagnostics]

    assert found("m.zero_grad()") == []
    assert found("pass") == [11]


NOAM = """
import torch

class NoamOpt:
    def __init__(self, model_size, factor, warmup, optimizer):
        self.optimizer = optimizer
        self._step = 0

    def step(self):
        self._step += 1
        self.optimizer.step()

""" + SIMPLE_LOSS_COMPUTE.replace("{returned}", "loss.item() * norm")


def test_a_wrapper_reset_through_the_optimizer_it_holds_is_covered():
    # the annotated Transformer's SimpleLossCompute (xbresson/CE7454_2019): NoamOpt holds the Adam it steps
    assert lines(NOAM.format(reset="self.opt.optimizer.zero_grad()")) == []
    assert lines(NOAM.format(reset="self.d_optimizer.zero_grad()")) == [22]  # another optimizer


def test_the_finding_names_a_backward_that_accumulates_not_autograd_grad():
    # jingweiz/pytorch-rl's ACER worker: ``torch.autograd.grad`` first (it fills no ``.grad``), then backward
    src = """
    import torch
    from torch.autograd import grad

    class Worker:
        def _backward(self, loss, out, value_loss):
            g = grad(outputs=loss, inputs=out, retain_graph=True)[0]
            self.model.zero_grad()
            value_loss.backward()
            self._ensure_global_grads()  # hands the local gradients to the master model (another file)
            self.master.optimizer.step()
    """
    assert lines(src) == [9]  # not the grad() call on line 7


def test_a_module_reset_through_a_name_bound_from_the_optimizers_owner_covers_it():
    # mit-han-lab/once-for-all: ``dynamic_net = run_manager.network``, ``run_manager.optimizer`` steps
    src = """
    def train_one_epoch(run_manager, args):
        dynamic_net = {binding}
        for i, (images, labels) in enumerate(run_manager.run_config.train_loader):
            dynamic_net.zero_grad()
            for _ in range(args.dynamic_batch_size):
                loss = run_manager.train_criterion(dynamic_net(images), labels)
                loss.backward()
            run_manager.optimizer.step()
    """
    assert lines(src.format(binding="run_manager.network")) == []
    assert lines(src.format(binding="other_manager.network")) == [9]
