"""Healthy: fixtures/TGL001/bad_gan_generator_not_reset.py repaired (opt_g.zero_grad() added),
the discriminator still receiving gradients from the generator's loss."""
import torch
from torch import nn


def main(device: str = "cpu", steps: int = 8) -> None:
    torch.manual_seed(0)
    latent = 8
    gen = nn.Sequential(nn.Linear(latent, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
    disc = nn.Sequential(nn.Linear(2, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1)).to(device)
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.5, 0.999))
    bce = nn.BCEWithLogitsLoss()
    for _ in range(steps):
        real = torch.randn(32, 2, device=device) * 0.5 + 2.0
        z = torch.randn(32, latent, device=device)
        fake = gen(z)

        opt_d.zero_grad()
        d_real = disc(real)
        d_fake = disc(fake.detach())
        d_loss = bce(d_real, torch.ones_like(d_real)) + bce(d_fake, torch.zeros_like(d_fake))
        d_loss.backward()
        opt_d.step()

        opt_g.zero_grad()
        g_out = disc(fake)
        g_loss = bce(g_out, torch.ones_like(g_out))
        g_loss.backward()
        opt_g.step()
