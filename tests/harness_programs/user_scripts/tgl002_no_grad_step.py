"""User-style script: the fine-tuning step was put under no_grad with the evaluation."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Linear(8, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def step(x, y):
    with torch.no_grad():
        pred = model(x)
        loss = nn.functional.mse_loss(pred, y)
        loss.backward()  # measured: TGL002
        optimizer.step()


for _ in range(3):
    step(torch.randn(16, 8), torch.randn(16, 1))
