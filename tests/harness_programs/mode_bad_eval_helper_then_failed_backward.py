"""Defective (TGL201) at the helper's call: evaluate() runs the model under no_grad in training
mode. The training forward is also under no_grad by mistake and its backward fails (TGL002): those
calls are TGL002's, the helper's stay TGL201's (another frame than the failing backward's)."""
import torch
from torch import nn


def evaluate(model: nn.Module, device: str) -> float:
    with torch.no_grad():
        return model(torch.randn(16, 4, device=device)).mean().item()


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 1)).to(device)
    for _ in range(steps):
        evaluate(model, device)
        with torch.no_grad():
            loss = model(torch.randn(16, 4, device=device)).pow(2).mean()
        try:
            loss.backward()
        except RuntimeError:
            pass
