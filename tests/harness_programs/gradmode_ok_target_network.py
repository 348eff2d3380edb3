"""Healthy: a DQN target network runs under no_grad; its parameters require grad but no
optimizer steps them (they are copied from the online network)."""
import copy

import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    online = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3)).to(device)
    target = copy.deepcopy(online)
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-3)
    for step in range(steps):
        obs, nxt = torch.randn(16, 6, device=device), torch.randn(16, 6, device=device)
        reward = torch.randn(16, device=device)
        with torch.no_grad():
            goal = reward + 0.99 * target(nxt).max(dim=1).values
        q = online(obs).max(dim=1).values
        loss = nn.functional.smooth_l1_loss(q, goal)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 4 == 3:
            target.load_state_dict(online.state_dict())


if __name__ == "__main__":
    main()
