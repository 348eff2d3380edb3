# TGL002 FP (big-sleep/deep-daze Imagine): the nn.Module's forward IS the optimisation driver
# (`imagine = Imagine(...); imagine()`); it owns the optimizer and is never evaluated under no_grad.
import torch
from torch import nn
from torch.optim import Adam


class Imagine(nn.Module):
    def __init__(self, model, iterations=100):
        super().__init__()
        self.model = model
        self.iterations = iterations
        self.optimizer = Adam(self.model.parameters(), 1e-3)

    def train_step(self):
        loss = self.model()
        loss.backward()                  # TGL002 reported: "this backward runs inside `Imagine.forward`"
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss

    def forward(self):
        with torch.no_grad():
            self.model()                 # warm-up step
        for i in range(self.iterations):
            loss = self.train_step()
            print(loss.item())
