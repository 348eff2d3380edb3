"""Defective in one parameter group only: the head's gradients are reset by hand each
step, the backbone's never are (one optimizer, two parameter groups)."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    backbone = nn.Linear(4, 8).to(device)
    head = nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD([{"params": backbone.parameters()}, {"params": head.parameters(), "lr": 0.01}], lr=0.1)
    for _ in range(steps):
        for p in head.parameters():
            p.grad = None
        head(backbone(torch.randn(8, 4, device=device))).pow(2).mean().backward()
        opt.step()
