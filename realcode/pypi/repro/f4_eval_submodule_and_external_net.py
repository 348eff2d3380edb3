# TGL201 FP (deep-daze deep_daze.py:529): DeepDaze (same file) holds a CLIP perceptor that the caller put in
# eval (`clip_perceptor.eval()`) and a SIREN from siren_pytorch (Linear + sine, dropout 0); with
# return_loss=False only the SIREN runs. No dropout/batch norm is active.
import torch
from torch import nn
from torch.optim import Adam
from siren_pytorch import SirenNet, SirenWrapper
from .clip import load


class DeepDaze(nn.Module):
    def __init__(self, clip_perceptor):
        super().__init__()
        self.perceptor = clip_perceptor
        self.model = SirenWrapper(SirenNet(dim_in=2, dim_hidden=256, num_layers=8, dim_out=3),
                                  image_width=512, image_height=512)

    def forward(self, text_embed, return_loss=True):
        out = self.model()
        if not return_loss:
            return out
        return out, -torch.cosine_similarity(text_embed, self.perceptor.encode_image(out)).mean()


class Imagine(nn.Module):
    def __init__(self):
        super().__init__()
        clip_perceptor, norm = load("ViT-B/32")
        self.perceptor = clip_perceptor.eval()
        self.model = DeepDaze(self.perceptor)
        self.optimizer = Adam(self.model.model.parameters(), 1e-5)

    def train_step(self):
        out, loss = self.model(self.clip_encoding)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    @torch.no_grad()
    def save_image(self):
        img = self.model(self.clip_encoding, return_loss=False)   # TGL201 reported
        return img

    def forward(self):
        for i in range(10):
            self.train_step()
        self.save_image()
