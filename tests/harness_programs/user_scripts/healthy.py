"""User-style script: a correct loop (reset, detached logging, eval under no_grad)."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
history = []
for epoch in range(3):
    model.train()
    for _ in range(8):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.randn(32, 8)), torch.randint(0, 2, (32,)))
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    model.eval()
    with torch.no_grad():
        model(torch.randn(64, 8))
