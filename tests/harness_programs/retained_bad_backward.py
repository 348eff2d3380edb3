"""Defective: losses stored with their graphs although backward runs every step."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(64, 16, device=device)).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss)
