"""Healthy (for TGL001): each step's gradients come from ``torch.autograd.grad`` and are assigned
by hand (``p.grad = g``), a new tensor every step that no accumulation of the parameter made; a
second model is handed fresh copies (``q.grad = p.grad.clone()``), never the same tensors."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    mirror = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_mirror = torch.optim.SGD(mirror.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        for p, g in zip(model.parameters(), grads):
            p.grad = g
        for p, q in zip(model.parameters(), mirror.parameters()):
            q.grad = p.grad.clone()
        opt.step()
        opt_mirror.step()
