"""Healthy: retain_graph=True on the only backward, but the loss is deleted right after,
so nothing of the graph is alive when the next iteration starts."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(32, 16, device=device)).pow(2).mean()
        loss.backward(retain_graph=True)
        del loss
        opt.step()
