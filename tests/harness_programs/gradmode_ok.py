"""Healthy near miss: loss built with grad enabled, backward called inside no_grad (works)."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    for _ in range(steps):
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean()
        with torch.no_grad():
            loss.backward()
