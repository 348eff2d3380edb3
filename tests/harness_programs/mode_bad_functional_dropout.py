"""Defective: a model whose forward calls F.dropout(training=self.training), evaluated
under no_grad without eval()."""
import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 16), nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.dropout(F.relu(self.fc1(x)), p=0.3, training=self.training))


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4, device=device)).pow(2).mean().backward()
        opt.step()
    with torch.no_grad():
        model(torch.randn(8, 4, device=device))
