"""Defective, slowly: one loss (with its graph) is kept every 25 steps."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    snapshots = []
    for step in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(16, 8, device=device)).pow(2).mean()
        loss.backward()
        opt.step()
        if step % 25 == 0:
            snapshots.append(loss)
