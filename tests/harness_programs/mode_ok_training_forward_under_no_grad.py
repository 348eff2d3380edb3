"""Not TGL201: the training forward itself runs under no_grad by mistake (TGL002's defect) and its
backward fails; the model is in training mode on purpose. nanoGPT with its forward moved under
no_grad; the script goes on after the failure (it logs it), as a notebook cell would."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.1), nn.Linear(8, 1)).to(device)
    model.train()
    failures = 0
    for _ in range(steps):
        with torch.no_grad():
            loss = model(torch.randn(16, 4, device=device)).pow(2).mean()
        try:
            loss.backward()
        except RuntimeError:
            failures += 1
    assert failures == steps
