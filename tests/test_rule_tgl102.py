"""TGL102 retain-graph-in-loop on snippets: tricky loops and near misses."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.retain_graph_in_loop import RetainGraphInLoop


def lines(src: str) -> list[int]:
    result = lint_source(textwrap.dedent(src), "x.py", [RetainGraphInLoop])
    return [d.line for d in result.diagnostics if d.code == "TGL102"]


def messages(src: str) -> list[str]:
    return [f"{d.message}, {d.detail}" for d in lint_source(textwrap.dedent(src), "x.py", [RetainGraphInLoop]).diagnostics]


FIRES = {
    "simple": """
        import torch
        model = torch.nn.Linear(3, 1)
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            loss.backward(retain_graph=True)
        """,
    "while_loop": """
        import torch
        model = torch.nn.Linear(2, 2)
        step = 0
        while step < 10:
            x = torch.randn(4, 2)
            loss = model(x).sum()
            loss.backward(retain_graph=True)
            step += 1
        """,
    "backward_inside_if": """
        import torch
        model = torch.nn.Linear(2, 2)
        for step, (x, t) in enumerate(loader):
            loss = model(x).sum()
            if step % 2 == 0:
                loss.backward(retain_graph=True)
        """,
    "nested_loops_inner_rebuilds": """
        import torch
        for epoch in range(3):
            for x, y in train_loader:
                loss = criterion(model(x), y)
                loss.backward(retain_graph=True)
        """,
    "function_params_loader": """
        import torch
        def train(model, loader, optimizer):
            for x, y in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x), y)
                grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
        """,
    "alias_autograd_backward": """
        import torch as T
        net = T.nn.Linear(3, 1)
        data = T.randn(5, 3)
        for step in range(10):
            loss = net(data).sum()
            T.autograd.backward(loss, retain_graph=True)
        """,
    "forward_under_autocast": """
        import torch
        scaler = torch.amp.GradScaler()
        for x, y in train_loader:
            with torch.autocast("cpu"):
                loss = crit(model(x), y)
            scaler.scale(loss).backward(retain_graph=True)
        """,
    "detached_by_helper_still_retains": """
        def repackage_hidden(h):
            return h.detach()
        for x, y in train_loader:
            hidden = repackage_hidden(hidden)
            output, hidden = model(x, hidden)
            loss = criterion(output, y)
            loss.backward(retain_graph=True)
        """,
}


@pytest.mark.parametrize("name", sorted(FIRES))
def test_fires(name):
    assert len(lines(FIRES[name])) == 1


SILENT = {
    "retain_false": """
        for x in loader:
            loss = model(x).sum()
            loss.backward(retain_graph=False)
        """,
    "no_retain": """
        for x in loader:
            model(x).sum().backward()
        """,
    "non_literal_flag": """
        for x in loader:
            loss = model(x).sum()
            loss.backward(retain_graph=flag)
        """,
    "jacobian_rows_grad": """
        import torch
        x = torch.randn(3, requires_grad=True)
        y = x.exp() * 2
        for i in range(3):
            (g,) = torch.autograd.grad(y[i], x, retain_graph=True)
        """,
    "jacobian_rows_backward": """
        import torch
        y = model(x)
        for i in range(3):
            y[i].backward(retain_graph=True)
        """,
    "rows_over_graph_built_in_outer_loop": """
        for x in loader:
            y = model(x)
            for i in range(2):
                y[:, i].sum().backward(retain_graph=True)
        """,
    "rows_over_parameter_tensor": """
        import torch
        def rows(out, params):
            for i in range(out.shape[1]):
                g = torch.autograd.grad(out[:, i].sum(), params, retain_graph=True)
        """,
    "second_backward_frees": """
        for x in loader:
            out = model(x)
            l1 = out.sum()
            l2 = out.mean()
            l1.backward(retain_graph=True)
            l2.backward()
        """,
    "gan_generator_step_after": """
        import torch
        for real in loader:
            fake = G(torch.randn(4, 8))
            d_loss = bce(D(real), ones) + bce(D(fake), zeros)
            d_loss.backward(retain_graph=True)
            opt_d.step()
            g_loss = bce(D(fake), ones)
            g_loss.backward()
        """,
    "later_backward_in_helper": """
        def g_step(fake):
            D(fake).sum().backward()
        for x in loader:
            fake = G(x)
            D(fake).sum().backward(retain_graph=True)
            g_step(fake)
        """,
    "inner_loop_then_outer_backward": """
        for x in loader:
            for k in range(3):
                lk = model(x).sum()
                lk.backward(retain_graph=True)
            total.backward()
        """,
    "create_graph_higher_order": """
        import torch
        for task in tasks:
            loss = f(task, w)
            g = torch.autograd.grad(loss, w, create_graph=True, retain_graph=True)
            w = w - 0.1 * g[0]
        """,
    "truncated_bptt_every_k": """
        import torch
        h = torch.zeros(1, 2, 8)
        for t, x in enumerate(xs_loader):
            if t % 5 == 0:
                h = h.detach()
            out, h = rnn(x, h)
            out.sum().backward(retain_graph=True)
        """,
    "losses_built_before_loop": """
        losses = model(x)
        for l in losses:
            l.backward(retain_graph=True)
        """,
    "not_in_a_loop": """
        loss = model(x).sum()
        loss.backward(retain_graph=True)
        """,
}


@pytest.mark.parametrize("name", sorted(SILENT))
def test_silent(name):
    assert lines(SILENT[name]) == []


def test_carried_state_message_names_the_state():
    (msg,) = messages("""
        import torch
        rnn = torch.nn.RNN(4, 8)
        h = torch.zeros(1, 2, 8)
        for x in torch.randn(10, 1, 2, 4):
            out, h = rnn(x, h)
            loss = out.pow(2).mean()
            loss.backward(retain_graph=True)
        """)
    assert "`h` carries it into the next iteration" in msg
    assert "h = h.detach()" in msg and "memory and time grow every step" in msg


def test_carried_attribute_state():
    (msg,) = messages("""
        class Trainer:
            def run(self, loader):
                for x in loader:
                    out, self.hidden = self.rnn(x, self.hidden)
                    out.sum().backward(retain_graph=True)
        """)
    assert "`self.hidden` carries it" in msg


def test_detached_each_iteration_is_the_plain_message():
    (msg,) = messages("""
        import torch
        h = torch.zeros(1, 2, 8)
        for x in train_loader:
            out, h = rnn(x, h)
            out.sum().backward(retain_graph=True)
            h = h.detach()
        """)
    assert "carries" not in msg and "drop `retain_graph=True`" in msg


def test_reported_at_the_backward_call():
    src = """
        import torch
        for x in loader:
            loss = model(x).sum()
            torch.autograd.grad(
                loss, params, retain_graph=True)
        """
    assert lines(src) == [5]


_STEPPED_BETWEEN = """
    import torch
    from itertools import chain
    from torch import nn
    G, E, D = nn.Linear(8, 2), nn.Linear(2, 8), nn.Linear(2, 1)
    {params}
    opt_ge = torch.optim.Adam({arg})
    opt_d = torch.optim.Adam(D.parameters())
    for z, real in loader:
        gen = G(z)
        d_gen = D(gen)
        ge_loss = d_gen.mean() + (E(gen) - z).pow(2).mean()
        ge_loss.backward(retain_graph=True)
        opt_ge.step()
        {between}
        d_loss = D(real).mean() - d_gen.mean()
        d_loss.backward()
        opt_d.step()
    """


def test_reused_after_a_step_over_parameters_bound_to_a_name():
    # ClusterGAN: the optimizer's parameters are a chain bound to a name first (fixture
    # bad_stepped_before_retained_reuse): the later backward goes through G, which opt_ge stepped
    for params, arg in (("ge = chain(G.parameters(), E.parameters())", "ge"),
                        ("pass", "chain(G.parameters(), E.parameters())")):
        (msg,) = messages(_STEPPED_BETWEEN.format(params=params, arg=arg, between="pass"))
        assert "`opt_ge.step()` updates weights that graph saved in between" in msg


def test_reused_after_a_step_is_reported_past_a_helper_that_backpropagates():
    # a gradient-penalty helper (it calls autograd.grad) between the step and the later backward:
    # what the helper shares cannot be told, but the later backward's reuse is a defect anyway
    src = _STEPPED_BETWEEN.format(params="pass", arg="G.parameters()", between="gp = penalty(D, real)") + """
    def penalty(critic, x):
        x = x.requires_grad_(True)
        s = critic(x)
        return torch.autograd.grad(s, x, torch.ones_like(s), create_graph=True)[0].norm()
    """
    (msg,) = messages(src)
    assert "`opt_ge.step()` updates weights that graph saved in between" in msg
    # with only the helper after the step (no later backward of the retained graph): no verdict
    only_helper = src.replace("d_loss = D(real).mean() - d_gen.mean()", "d_loss = gp")
    assert messages(only_helper) == []


def test_a_step_over_other_modules_is_not_a_reuse_defect():
    # opt_ge steps E only: the later backward goes through G and D, whose saved weights did not change
    assert messages(_STEPPED_BETWEEN.format(params="pass", arg="E.parameters()", between="pass")) == []


_RESTORED_GAN = """
    import torch
    import torch.nn as nn
    generator = nn.DataParallel(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)))
    discriminator = nn.DataParallel(nn.Sequential(nn.Linear(2, 8), nn.Linear(8, 1), nn.Sigmoid()))
    gen_optim = torch.optim.Adam(generator.parameters())
    dis_optim = torch.optim.Adam(discriminator.parameters())
    try:
        generator, discriminator = torch.load('./model/vanilla_gan.pkl')
    except Exception:
        pass
    for epoch in range(10):
        for image, _ in loader:
            dis_optim.zero_grad()
            gen_fake = generator{call}(torch.randn(8, 4))
            dis_loss = loss_func(discriminator{call}(gen_fake), zeros) + loss_func(discriminator{call}(image), ones)
            dis_loss.backward(retain_graph=True)
            dis_optim.step()
            gen_optim.zero_grad()
            gen_fake = generator{call}(torch.randn(8, 4))
            gen_loss = loss_func(discriminator{call}(gen_fake), ones)
            gen_loss.backward()
            gen_optim.step()
"""


@pytest.mark.parametrize("call", ["", ".forward"])
def test_module_called_through_forward_is_no_graph_built_before_the_loop(call):
    # GunhoChoi/PyTorch-FastCampus GAN_Basic: ``generator.forward(z)`` read ``generator`` (restored
    # from a checkpoint before the loop) as a value that may carry a graph into every iteration
    assert lines(_RESTORED_GAN.format(call=call)) == [17]


_FISHER = """
import torch
from lib import calc_logprob


def train(net_act, opt_act, loader):
    for states_v, actions_v in loader:
        log_prob_v = calc_logprob(net_act(states_v), actions_v)
        if opt_act.steps % 10 == 0:
            opt_act.zero_grad()
            pg_fisher_loss = -log_prob_v.mean()
            pg_fisher_loss.backward(retain_graph=True)
        opt_act.zero_grad()
        loss_v = -({later}).mean()
        loss_v.backward()
        opt_act.step()
"""


def test_a_later_backward_computed_from_the_same_untraced_variable_may_need_the_graph():
    # the Deep RL Hands-On book's ACKTR: the Fisher statistics pass and the policy loss share log_prob_v
    from torchgradlint.engine import lint_source
    from torchgradlint.rules.retain_graph_in_loop import RetainGraphInLoop

    def found(later: str) -> list[int]:
        src = _FISHER.format(later=later)
        return [d.line for d in lint_source(src, "x.py", [RetainGraphInLoop]).diagnostics if d.code == "TGL102"]

    assert found("2 * log_prob_v") == []
    assert found("2 * net_act(states_v)") == [12]  # a new forward: the retained graph is waste


_AWAC = """
import torch
import torch.nn.functional as F
policy = torch.nn.Linear(4, 2)
log_beta = torch.zeros(1, requires_grad=True)
optimizer = torch.optim.Adam(policy.parameters())
beta = log_beta.exp()
for i in range(steps):
    logp = policy(obs).log_softmax(-1)[:, 0]
    weights = F.softmax(score / beta, dim=0)
    loss = (-logp * len(weights) * {weights}).mean()
    optimizer.zero_grad()
    loss.backward(retain_graph=True)
    optimizer.step()
"""


@pytest.mark.parametrize("weights, expected", [
    ("weights.detach()", [13]),  # no path back to the graph of ``beta`` built before the loop
    ("weights", []),  # every iteration backpropagates into ``beta``'s graph: it must be retained
])
def test_a_detached_or_measured_pre_loop_value_needs_no_retained_graph(weights, expected):
    # rlkit's AWAC buffer-policy reset: the weights from the temperature ``beta`` (computed before the
    # loop) enter the loss only detached and through ``len(...)``
    assert lines(_AWAC.format(weights=weights)) == expected
