"""Healthy near miss: first of two backwards of one iteration retains, the last frees."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    trunk = nn.Sequential(nn.Linear(16, 32), nn.ReLU()).to(device)
    head1, head2 = nn.Linear(32, 1).to(device), nn.Linear(32, 1).to(device)
    params = [*trunk.parameters(), *head1.parameters(), *head2.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        feat = trunk(torch.randn(64, 16, device=device))
        loss1 = head1(feat).pow(2).mean()
        loss2 = head2(feat).abs().mean()
        loss1.backward(retain_graph=True)
        loss2.backward()
        opt.step()
