"""Healthy near miss: training mode under no_grad, but no dropout or batch norm to be affected."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
    for _ in range(steps):
        with torch.no_grad():
            model(torch.randn(16, 4, device=device))
