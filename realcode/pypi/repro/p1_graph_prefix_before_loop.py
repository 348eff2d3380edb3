# TGL102 FP (backpack nll_base.py:123): `dist` (Categorical over the input's logits) is built once before the
# loop, so every `loss_tilde` backpropagates through that shared prefix: retain_graph=True is required.
import torch
from torch import stack
from torch.autograd import grad
from torch.distributions import Categorical


def compute_sampled_grads(subsampled_input, mc_samples):
    subsampled_input.requires_grad = True
    gradients = []
    dist = Categorical(logits=subsampled_input)
    for _ in range(mc_samples):
        y_tilde = dist.sample()
        loss_tilde = -dist.log_prob(y_tilde).sum()
        gradients.append(grad(loss_tilde, subsampled_input, retain_graph=True)[0])   # TGL102 reported
    return stack(gradients)
