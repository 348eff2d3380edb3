"""A seeded small CNN training run that saves outputs, gradients and parameters to argv[1]
(the run-never-changes-results test compares them bitwise with and without `run`)."""
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 1, 12, 12), torch.randint(0, 4, (64,)))
loader = DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.2), nn.Flatten(),
                      nn.Linear(4 * 10 * 10, 4))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
outputs, grads = [], []
for epoch in range(3):
    model.train()
    for x, y in loader:
        optimizer.zero_grad()
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    model.eval()
    with torch.no_grad():
        outputs.append(model(data.tensors[0][:8]))
torch.save({"outputs": outputs, "grads": grads, "state": model.state_dict()}, sys.argv[1])
