"""Defective: nn.MultiheadAttention (dropout=0.1) and SDPA with dropout_p > 0 in training
mode, evaluated under no_grad without eval()."""
import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, dropout=0.1, batch_first=True)
        self.proj = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, _ = self.attn(x, x, x)
        q, k, v = self.proj(a).chunk(3, dim=-1)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0)


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    block = Block().to(device)
    opt = torch.optim.Adam(block.parameters(), lr=1e-3)
    for _ in range(steps):
        opt.zero_grad()
        block(torch.randn(2, 5, 16, device=device)).pow(2).mean().backward()
        opt.step()
    with torch.no_grad():
        block(torch.randn(2, 5, 16, device=device))
