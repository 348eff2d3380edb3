"""Defective: evaluation under no_grad with the model still in training mode."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 4, device=device)).pow(2).mean().backward()
        opt.step()
        with torch.no_grad():
            model(torch.randn(16, 4, device=device))
