"""Defective: an evaluation loop without no_grad keeps every activation alive."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 8)).to(device)
    outputs = []
    for _ in range(steps):
        outputs.append(model(torch.randn(128, 64, device=device)))
