"""Healthy: each iteration first differentiates with torch.autograd.grad (a Fisher
statistics pass: the parameters' gradient hooks fire, nothing accumulates into
.grad), then resets, backpropagates and steps."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fisher = [torch.zeros_like(p) for p in model.parameters()]
    for _ in range(steps):
        out = model(torch.randn(8, 4, device=device))
        grads = torch.autograd.grad(out.mean(), list(model.parameters()), retain_graph=True)
        for f, g in zip(fisher, grads):
            f.add_(g * g)
        opt.zero_grad()
        out.pow(2).mean().backward()
        opt.step()
