"""Healthy: a standard two-optimizer GAN loop. Each optimizer is reset before its own
backward; the generator's backward also adds into the discriminator's gradients, which
the discriminator's optimizer resets before it steps again."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    gen = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
    disc = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1)).to(device)
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(disc.parameters(), lr=1e-3)
    bce = nn.BCEWithLogitsLoss()
    for _ in range(steps):
        real = torch.randn(16, 2, device=device)
        fake = gen(torch.randn(16, 4, device=device))
        opt_d.zero_grad()
        d_real, d_fake = disc(real), disc(fake.detach())
        (bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))).backward()
        opt_d.step()
        opt_g.zero_grad()
        g_out = disc(fake)
        bce(g_out, torch.ones_like(g_out)).backward()
        opt_g.step()
