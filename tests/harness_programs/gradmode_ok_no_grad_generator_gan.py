"""Healthy: the discriminator step runs the generator under no_grad (its parameters get
no gradient there), the generator step then trains it with grad on."""
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
        with torch.no_grad():
            fake = gen(torch.randn(16, 4, device=device))
        d_fake = disc(fake)
        opt_d.zero_grad()
        bce(d_fake, torch.zeros_like(d_fake)).backward()
        opt_d.step()
        g_out = disc(gen(torch.randn(16, 4, device=device)))
        opt_g.zero_grad()
        bce(g_out, torch.ones_like(g_out)).backward()
        opt_g.step()


if __name__ == "__main__":
    main()
