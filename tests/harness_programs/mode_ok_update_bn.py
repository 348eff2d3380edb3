"""Healthy: SWA's update_bn runs the model in training mode under no_grad on purpose."""
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, update_bn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)).to(device)
    swa = AveragedModel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(16, 4, device=device) for _ in range(steps)]
    for x in batches:
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        swa.update_parameters(model)
    update_bn(batches, swa)
