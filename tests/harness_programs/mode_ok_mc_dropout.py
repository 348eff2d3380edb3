"""Healthy: Monte-Carlo dropout. The model is put in eval mode and its dropout layers are
switched back on explicitly to sample predictions under no_grad."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4, device=device)).pow(2).mean().backward()
        opt.step()
    model.eval()
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.train()
    x = torch.randn(8, 4, device=device)
    with torch.no_grad():
        samples = torch.stack([model(x) for _ in range(10)])
    assert samples.std(0).sum() > 0
