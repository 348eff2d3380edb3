"""Cost of ``torchgradlint run``: time per training step of a small CNN on CPU, with and without probes.

Usage: ``python bench/run_overhead.py [--model cnn|policy] [--steps 200] [--rounds 5] [--threads 1] [--only]``

``--model policy`` times instead a PPO iteration shaped like cleanrl's ``ppo.py`` on CartPole: a
rollout of 128 calls of a small actor and critic (two 64-unit tanh layers each, 4 observations per
call) under no_grad, then 4 minibatch updates of 128 samples (Adam, gradient clipping). Module
calls dominate there, not arithmetic: the probes' cost per module call shows.

One process; each round measures the process CPU time of ``--steps`` training steps (forward, loss, backward,
optimizer step, and an evaluation batch under no_grad every 10 steps) with no probe,
with each probe alone (unless ``--only`` names configurations), with the core rules' probes and with
all probes (``run``'s default), in an interleaved order (reversed every other round). Prints per
configuration the median time per step, its min and max over the rounds, and the ratio of the
medians to the baseline's, plus the median of the per-round ratios (each round's configuration
against the same round's baseline: less sensitive to load that changes between rounds). The
probes copy no gradient (the stale-gradient probe compares version counters). The target is
<= 1.3x with all probes on (see docs/run.md).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from torchgradlint.harness.probe_map import probes_for
from torchgradlint.harness.run import CORE_RULES, Session


class SmallCNN(nn.Module):
    """Two conv blocks with batch norm and dropout, 28x28 inputs, 10 classes (~30k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.25), nn.Linear(32 * 7 * 7, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def train(steps: int, batch: int = 32) -> float:
    """CPU seconds of this process for ``steps`` healthy training steps (fresh model and data each call).

    Process CPU time (``time.process_time``), not wall time: on a shared machine other
    processes' load shows up in wall time but much less in this process's CPU time.
    """
    torch.manual_seed(0)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    xs = torch.randn(16, batch, 1, 28, 28)
    ys = torch.randint(0, 10, (16, batch))
    start = time.process_time()
    for i in range(steps):
        model.train()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xs[i % 16]), ys[i % 16])
        loss.backward()
        opt.step()
        if i % 10 == 9:
            model.eval()
            with torch.no_grad():
                model(xs[0])
    return time.process_time() - start


def _mlp(out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, out))


def train_policy(steps: int) -> float:
    """CPU seconds for ``steps`` PPO-shaped iterations (rollout under no_grad, then minibatch updates)."""
    torch.manual_seed(0)
    actor, critic = _mlp(2), _mlp(1)
    params = [*actor.parameters(), *critic.parameters()]
    opt = torch.optim.Adam(params, lr=2.5e-4, eps=1e-5)
    obs = torch.randn(128, 4, 4)
    start = time.process_time()
    for _ in range(steps):
        actions, values = [], []
        for t in range(128):
            with torch.no_grad():
                logits = actor(obs[t])
                values.append(critic(obs[t]))
                actions.append(torch.distributions.Categorical(logits=logits).sample())
        b_obs, b_act = obs.reshape(-1, 4), torch.stack(actions).reshape(-1)
        b_ret = torch.stack(values).reshape(-1) + 1.0
        for mb in torch.randperm(512).split(128):
            dist = torch.distributions.Categorical(logits=actor(b_obs[mb]))
            loss = -dist.log_prob(b_act[mb]).mean() + (critic(b_obs[mb]).squeeze(-1) - b_ret[mb]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(params, 0.5)
            opt.step()
    return time.process_time() - start


def run_config(probes: list[str] | None, steps: int, model: str = "cnn") -> float:
    fn = train_policy if model == "policy" else train
    if probes is None:
        return fn(steps)
    with Session(probes):
        return fn(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("cnn", "policy"), default="cnn")
    parser.add_argument("--steps", type=int, default=None, help="default: 200 (cnn), 10 (policy)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1: steadier figures)")
    parser.add_argument("--only", action="store_true", help="baseline, core probes and all probes only")
    args = parser.parse_args()
    if args.steps is None:
        args.steps = 10 if args.model == "policy" else 200
    torch.set_num_threads(args.threads)
    configs: dict[str, list[str] | None] = {"baseline": None}
    if not args.only:
        for name in probes_for():
            configs[name] = [name]
    configs["core probes"] = probes_for(CORE_RULES)
    configs["all probes"] = probes_for()
    times: dict[str, list[float]] = {k: [] for k in configs}
    warm = 2 if args.model == "policy" else 20
    run_config(None, warm, args.model)  # warm-up
    run_config(probes_for(), warm, args.model)
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in order:
            times[name].append(run_config(configs[name], args.steps, args.model) / args.steps)
    base = statistics.median(times["baseline"])
    what = "PPO-shaped iterations (128 no_grad rollout calls, 4 updates)" if args.model == "policy" \
        else "small CNN, batch 32,"
    print(f"{what} {args.steps} steps x {args.rounds} rounds, torch {torch.__version__}, "
          f"{args.threads} thread(s), CPU")
    print("CPU time of this process per step (time.process_time)")
    print("| configuration | ms/step (median) | min | max | ratio (medians) | per-round ratio (median) |")
    print("|---|---|---|---|---|---|")
    for name, ts in times.items():
        med = statistics.median(ts)
        paired = statistics.median(t / b for t, b in zip(ts, times["baseline"]))
        print(f"| {name} | {med * 1e3:.3f} | {min(ts) * 1e3:.3f} | {max(ts) * 1e3:.3f} | {med / base:.2f}x | "
              f"{paired:.2f}x |")


if __name__ == "__main__":
    main()
