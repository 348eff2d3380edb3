"""Defective: forward and backward both under no_grad."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    with torch.no_grad():
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean()
        loss.backward()
