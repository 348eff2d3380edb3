"""Deliberately inconsistent: silent for the linter (reset in a lambda it cannot see through)
but defective at run time, so the end-to-end test can check that disagreements fail the run."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(8, 4, device=device)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad() if False else None


if __name__ == "__main__":
    main()
