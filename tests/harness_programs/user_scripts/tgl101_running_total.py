"""User-style script: an epoch's running loss accumulated with its graph."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def train_epoch(steps):
    running = 0.0
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(torch.randn(32, 16)), torch.randn(32, 1))
        loss.backward()
        optimizer.step()
        running += loss  # measured: TGL101
    return running / steps


print("mean loss", float(train_epoch(40)))
