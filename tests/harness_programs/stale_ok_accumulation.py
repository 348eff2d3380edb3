"""Healthy near miss: gradient accumulation over 2 micro-batches, reset after each step."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(2 * steps):
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean() / 2
        loss.backward()
        if i % 2 == 1:
            opt.step()
            opt.zero_grad()
