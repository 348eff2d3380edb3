"""Healthy (for TGL001): gradients are zeroed in place, with the same tensors kept, once
between the backward and the step (zero_grad(set_to_none=False): the step sees zeros) and
by hand after the step; a clipped gradient is never summed onto one a step used."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean()
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 0.01)
        if i == 0:
            opt.zero_grad(set_to_none=False)
        opt.step()
        for p in model.parameters():
            p.grad.zero_()
