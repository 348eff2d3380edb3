"""Not a grad-mode defect: the logits are detached by mistake (grad mode is on all along);
the backward raises autograd's 'does not require grad' error."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        logits = model(torch.randn(8, 4, device=device)).detach()
        loss = nn.functional.cross_entropy(logits, torch.randint(0, 2, (8,), device=device))
        loss.backward()
        opt.step()
