"""Healthy: batches are slices of one preallocated dataset tensor (which grows with the
step count); every step's graph is freed by its backward."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    data = torch.randn(steps * 32, 64, device=device)
    model = nn.Sequential(nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(steps):
        x = data[i * 32:(i + 1) * 32]
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
