"""User-style script: retain_graph=True on the only backward of every step."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(24):
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 4, (16,)))
    loss.backward(retain_graph=True)  # measured: TGL102
    optimizer.step()
