"""Cost of ``torchgradlint run``: time per training step of a small CNN on CPU, with and without probes.

Usage: ``python bench/run_overhead.py [--steps 200] [--rounds 5] [--threads 1] [--only]``

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


def run_config(probes: list[str] | None, steps: int) -> float:
    if probes is None:
        return train(steps)
    with Session(probes):
        return train(steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1: steadier figures)")
    parser.add_argument("--only", action="store_true", help="baseline, core probes and all probes only")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    configs: dict[str, list[str] | None] = {"baseline": None}
    if not args.only:
        for name in probes_for():
            configs[name] = [name]
    configs["core probes"] = probes_for(CORE_RULES)
    configs["all probes"] = probes_for()
    times: dict[str, list[float]] = {k: [] for k in configs}
    run_config(None, 20)  # warm-up
    run_config(probes_for(), 20)
    for r in range(args.rounds):
        order = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in order:
            times[name].append(run_config(configs[name], args.steps) / args.steps)
    base = statistics.median(times["baseline"])
    print(f"small CNN, batch 32, {args.steps} steps x {args.rounds} rounds, torch {torch.__version__}, "
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
