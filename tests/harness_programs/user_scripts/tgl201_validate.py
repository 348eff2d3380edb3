"""User-style script: validation under no_grad with the model left in training mode."""
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
x_val, y_val = torch.randn(64, 8), torch.randint(0, 2, (64,))
for epoch in range(3):
    model.train()
    for _ in range(5):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(torch.randn(32, 8)), torch.randint(0, 2, (32,))).backward()
        optimizer.step()
    with torch.no_grad():
        acc = (model(x_val).argmax(1) == y_val).float().mean()  # measured: TGL201
    print(f"epoch {epoch}: accuracy {acc:.2f}")
