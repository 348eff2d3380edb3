# TGL101 FP: `torch_item` (pyro.infer.util, another file) is `x.item()` for a tensor: it returns a float.
import torch
from pyro.infer.util import torch_item


class CSIS:
    def loss_and_grads(self, grads, batch, params=()):
        loss = 0
        for trace in batch:
            particle_loss = self._differentiable_loss_particle(trace)
            if grads:
                torch.autograd.grad(particle_loss, params, allow_unused=True)
            loss += torch_item(particle_loss)   # TGL101 reported
        return loss

    def _differentiable_loss_particle(self, guide_trace):
        return -guide_trace.log_prob_sum()

    def validation_loss(self):
        return self.loss_and_grads(False, self.validation_batch)
