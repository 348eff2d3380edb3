"""User-style script: a DataLoader training loop that never resets gradients."""
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 10), torch.randint(0, 3, (256,)))
loader = DataLoader(data, batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for epoch in range(2):
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()  # measured: TGL001
