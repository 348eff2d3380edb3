"""TGL003 accum-zero-grad on short snippets the fixtures do not cover."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.accum_zero_grad import AccumZeroGrad, accumulation_gate


def lines(src: str) -> list[int]:
    """Lines of the TGL003 findings in ``src``."""
    result = lint_source(textwrap.dedent(src), "x.py", [AccumZeroGrad])
    return [d.line for d in result.diagnostics if d.code == "TGL003"]


HEAD = """\
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def loop(body: str, head: str = HEAD) -> str:
    """A loop over ``loader`` whose body is ``body`` (dedented, 4 spaces inside the loop)."""
    return head + "for i, (x, y) in enumerate(loader):\n" + textwrap.indent(textwrap.dedent(body), "    ")


@pytest.mark.parametrize("gate", ["(i + 1) % accum_steps == 0", "not (i + 1) % 4", "i % k == k - 1",
                                  "step_in_window == args.gradient_accumulation_steps",
                                  "accelerator.sync_gradients", "n_accum >= 8"])
def test_reset_every_micro_batch_fires_for_each_gate(gate):
    assert lines(loop(f"""\
        optimizer.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        if {gate}:
            optimizer.step()
    """)) == [5]


def test_reset_at_the_end_of_the_body_fires():
    assert lines(loop("""\
        model(x).pow(2).mean().backward()
        if (i + 1) % 4 == 0:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    """)) == [8]


def test_module_reset_and_helper_reset_fire():
    src = HEAD + """\
def reset(m):
    for p in m.parameters():
        p.grad = None
for i, (x, y) in enumerate(loader):
    model.zero_grad()
    reset(model)
    model(x).sum().backward()
    if i % 4 == 3:
        optimizer.step()
"""
    assert lines(src) == [8, 9]


def test_scaler_step_under_gate_fires():
    assert lines(loop("""\
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean() / 4
        scaler.scale(loss).backward()
        if (i + 1) % 4 == 0:
            scaler.step(optimizer)
            scaler.update()
    """)) == [5]


def test_aliased_imports_fire():
    assert lines("""\
        import torch.optim as O
        from torch import nn
        net = nn.Linear(3, 1)
        opt = O.Adam(net.parameters())
        for step, batch in enumerate(data_loader):
            opt.zero_grad()
            net(batch).mean().backward()
            if step % grad_accum == 0:
                opt.step()
    """) == [6]


@pytest.mark.parametrize("body", [
    # reset in the step's branch, after or before the step
    """\
    model(x).sum().backward()
    if (i + 1) % 4 == 0:
        optimizer.step()
        optimizer.zero_grad()
    """,
    """\
    model(x).sum().backward()
    if (i + 1) % 4 == 0:
        optimizer.step()
    if (i + 1) % 4 == 0:
        optimizer.zero_grad()
    """,
    # reset gated on the window's start
    """\
    if i % 4 == 0:
        optimizer.zero_grad()
    model(x).sum().backward()
    if (i + 1) % 4 == 0:
        optimizer.step()
    """,
    # the step runs on every iteration
    """\
    optimizer.zero_grad()
    model(x).sum().backward()
    optimizer.step()
    """,
    # a skip guard for non-finite values, not an accumulation gate
    """\
    optimizer.zero_grad()
    model(x).sum().backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if torch.isfinite(norm):
        optimizer.step()
    """,
    """\
    optimizer.zero_grad()
    loss = model(x).sum()
    skip = not torch.isfinite(loss)
    loss.backward()
    if not skip:
        optimizer.step()
    """,
    # backward only on the iterations that step (an update every N environment steps)
    """\
    optimizer.zero_grad()
    buffer.append(x)
    if i % update_every == 0:
        model(torch.stack(buffer)).sum().backward()
        optimizer.step()
    """,
    # the step's branch backpropagates itself (TD3: the actor every `policy_freq` critic steps)
    """\
    actor_opt.zero_grad()
    critic_opt.zero_grad()
    critic_loss(x).backward()
    critic_opt.step()
    if i % policy_freq == 0:
        actor_loss(x).backward()
        actor_opt.step()
    """,
])
def test_near_misses_are_silent(body):
    assert lines(loop(body)) == []


def test_reset_of_another_optimizer_is_silent():
    assert lines("""\
        import torch
        G, D = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
        opt_g = torch.optim.Adam(G.parameters())
        opt_d = torch.optim.Adam(D.parameters())
        for i, real in enumerate(loader):
            d_loss = D(real).mean() - D(G(z).detach()).mean()
            d_loss.backward()
            if (i + 1) % 2 == 0:
                opt_d.step()
                opt_d.zero_grad()
            opt_g.zero_grad()
            D(G(z)).mean().backward()
            opt_g.step()
    """) == []


ACCELERATE = """\
from accelerate import Accelerator
import torch
accelerator = Accelerator(gradient_accumulation_steps=4)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.AdamW(model.parameters())
model, optimizer = accelerator.prepare(model, optimizer)
for batch in loader:
    with accelerator.accumulate(model):
        loss = model(batch).mean()
        accelerator.backward(loss)
        optimizer.step()
        RESET
"""


def test_accelerate_module_reset_inside_accumulate_fires():
    assert lines(ACCELERATE.replace("RESET", "model.zero_grad()")) == [12]


@pytest.mark.parametrize("reset", ["optimizer.zero_grad()",
                                   "if accelerator.sync_gradients:\n            model.zero_grad()"])
def test_accelerate_optimizer_reset_or_synced_reset_is_silent(reset):
    assert lines(ACCELERATE.replace("RESET", reset)) == []


def test_accelerator_without_accumulation_steps_is_silent():
    src = ACCELERATE.replace("Accelerator(gradient_accumulation_steps=4)", "Accelerator(mixed_precision='bf16')")
    assert lines(src.replace("RESET", "model.zero_grad()")) == []
    src = ACCELERATE.replace("Accelerator(gradient_accumulation_steps=4)", "Accelerator(**accelerator_kwargs)")
    assert lines(src.replace("RESET", "model.zero_grad()")) == [12]


def test_prepared_optimizer_reset_with_sync_gate_is_silent():
    src = ACCELERATE.replace("    with accelerator.accumulate(model):\n", "    if True:\n").replace(
        "        optimizer.step()\n        RESET\n",
        "        if accelerator.sync_gradients:\n            optimizer.step()\n        optimizer.zero_grad()\n")
    assert lines(src) == []


def test_foreign_framework_file_is_silent():
    assert lines("""\
        import mxnet as mx
        for i, (x, y) in enumerate(loader):
            net.zero_grad()
            loss = net(x).sum()
            loss.backward()
            if i % 4 == 0:
                optimizer.step()
    """) == []


@pytest.mark.parametrize("test,expected", [("(i + 1) % k == 0", True), ("accelerator.sync_gradients", True),
                                           ("args.gradient_accumulation_steps > 1", True),
                                           ("torch.isfinite(norm)", False), ("not skip_step", False),
                                           ("epoch > warmup", False)])
def test_accumulation_gate(test, expected):
    import libcst as cst

    assert accumulation_gate(cst.parse_expression(test)) is expected


# -- the nested shape: an inner loop over the accumulation window, the step after it (nanoGPT) ------
NESTED = HEAD + """\
for it in range(max_iters):
{before}    for micro_step in range({window}):
        loss = model(x).pow(2).mean() / {window}
{inside}        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
{after}"""


def nested(window: str = "gradient_accumulation_steps", before: str = "", inside: str = "", after: str = "") -> str:
    return NESTED.format(window=window, before=before, inside=inside, after=after)


@pytest.mark.parametrize("reset", ["optimizer.zero_grad(set_to_none=True)", "model.zero_grad()"])
@pytest.mark.parametrize("window", ["gradient_accumulation_steps", "args.grad_accum", "self.accum_iter"])
def test_reset_on_every_micro_step_of_the_window_fires(reset, window):
    assert lines(nested(window, inside=f"        {reset}\n")) == [7]


def test_reset_after_the_backward_of_each_micro_step_fires():
    src = nested().replace("        scaler.scale(loss).backward()\n",
                           "        scaler.scale(loss).backward()\n        optimizer.zero_grad()\n")
    assert lines(src) == [8]


@pytest.mark.parametrize("kw", [
    {"after": "    optimizer.zero_grad(set_to_none=True)\n"},  # nanoGPT as written: after the step
    {"before": "    optimizer.zero_grad()\n"},  # once per step, before the window
    {"inside": "        if micro_step == 0:\n            optimizer.zero_grad()\n"},  # at the window's start
    # a per-sample loop that keeps each sample's gradients before the next reset
    {"window": "len(batch)",
     "inside": "        per_sample.append([p.grad for p in model.parameters()])\n        optimizer.zero_grad()\n"},
    {"inside": "        other_optimizer.zero_grad()\n"},  # another optimizer's gradients
])
def test_nested_near_misses_are_silent(kw):
    head = HEAD + "other = torch.nn.Linear(4, 1)\nother_optimizer = torch.optim.SGD(other.parameters(), lr=0.1)\n"
    assert lines(nested(**kw).replace(HEAD, head, 1)) == []


N_CRITIC = """
import torch

G_optimizer = torch.optim.Adam(G.parameters())
D_optimizer = torch.optim.Adam(D.parameters())

def train_G():
    z = torch.randn(8, 100)
    G_loss = -D(G(z)).mean()
    G.zero_grad()
    {g_backward}
    G_optimizer.step()

def train_D(x_real):
    x_fake = G(torch.randn(8, 100)).detach()
    D_loss = D(x_fake).mean() - D(x_real).mean()
    D.zero_grad()
    D_loss.backward()
    D_optimizer.step()

it_d = 0
for x_real in data_loader:
    train_D(x_real)
    it_d += 1
    if it_d % n_d == 0:
        train_G()
"""


def test_a_generator_trained_by_its_own_helper_every_n_critic_steps_is_no_accumulation():
    # LynnHo/DCGAN-LSGAN-WGAN-GP-DRAGAN-Pytorch: train_G() backpropagates its own loss before it steps
    assert lines(N_CRITIC.format(g_backward="G_loss.backward()")) == []
    assert lines(N_CRITIC.format(g_backward="pass")) == [23]  # a gated helper that only steps: still reported


GEN_ITERS = """\
import torch
G = torch.nn.Linear(4, 4)
optimizer_g = torch.optim.Adam(G.parameters())
GEN_ITERS = 1
for x in loader:
    for i in range({iters}):
        G.zero_grad()
        cost = G(torch.randn(8, 4)).mean()
        cost.backward()
        {extra}
    optimizer_g.step()
"""


@pytest.mark.parametrize("iters, extra, expected", [
    ("gen_iters", "", [7]),  # improved-wgan-pytorch: only the last generator pass reaches the step
    ("3", "", [7]),
    ("1", "", []),  # one pass: nothing to lose
    ("GEN_ITERS", "", []),  # a constant 1
    ("gen_iters", "grads.append([p.grad.clone() for p in G.parameters()])", []),  # per-sample gradients kept
    ("gen_iters", "torch.nn.utils.clip_grad_norm_(G.parameters(), 1.0)", []),
])
def test_a_reset_in_every_pass_of_a_loop_before_one_step_after_it(iters, extra, expected):
    assert lines(GEN_ITERS.format(iters=iters, extra=extra)) == expected


def test_a_loop_whose_helper_resets_and_steps_under_its_own_gate_is_silent():
    # poutyne's n-batches-per-step fit: the helper resets at a window's start and steps at its end;
    # the step after the loop only catches a window the last batch left open
    src = """\
import torch
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

def fit_batch(x, n, k):
    if (n - 1) % k == 0:
        optimizer.zero_grad()
    model(x).sum().backward()
    if n % k == 0:
        optimizer.step()
        return True
    return False

for epoch in range(10):
    for n, x in enumerate(loader, 1):
        stepped = fit_batch(x, n, k)
    if not stepped:
        optimizer.step()
"""
    assert lines(src) == []
