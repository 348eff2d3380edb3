# TGL101 FP (avalanche SGDUpdate/DER/ER-ACE/ER-AML): `self.loss` is rebound to a fresh zero tensor at the
# top of every iteration and backpropagated (by the base class's `self.backward()`, another file) in it.
import torch
import torch.nn.functional as F


class SGDUpdate:
    def training_epoch(self):
        for self.mbatch in self.dataloader:
            self.optimizer.zero_grad()
            self.loss = self._make_empty_loss()      # torch.zeros(1) in base_sgd.py
            self.mb_output = self.forward()
            self.loss += F.cross_entropy(self.mb_output, self.mb_y)   # TGL101 reported
            self.backward()                          # self.loss.backward() in base_sgd.py
            self.optimizer_step()
