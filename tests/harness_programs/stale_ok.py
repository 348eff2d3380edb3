"""Healthy: set_to_none reset before each backward."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean()
        loss.backward()
        opt.step()
