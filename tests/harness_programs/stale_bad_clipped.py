"""Defective: gradients are never reset; each step's stale sum is scaled in place before the step
(GradScaler's unscale_, then clip_grad_norm_, as nanoGPT and cleanrl do)."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device)
    for _ in range(steps):
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        scaler.step(opt)
        scaler.update()
