"""Defective, silently: the forward runs under no_grad and requires_grad_() makes the
backward run anyway; the parameters never get gradients."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        with torch.no_grad():
            out = model(torch.randn(8, 4, device=device))
        loss = out.pow(2).mean().requires_grad_()
        loss.backward()
        opt.step()
    assert all(p.grad is None for p in model.parameters())
