# TGL102 FP (pyro contrib/oed/glmm/guides.py:152, new in 6b414cd): Hessian rows. `dy` is computed with
# create_graph=True before the loop; each row `dyi` is a slice of it, and every row's grad goes back through
# the same pre-loop graph, so retain_graph=True is required (DESIGN near miss).
import torch


def hessian_diag(y, x, event_size):
    dy = torch.autograd.grad(y, [x], create_graph=True)[0]
    flat_dy = dy.reshape(-1, event_size)
    H = []
    for i in range(flat_dy.shape[-1]):
        dyi = flat_dy.index_select(-1, torch.tensor([i]))
        Hi = torch.autograd.grad([dyi], [x], grad_outputs=[torch.ones_like(dyi)], retain_graph=True)[0]  # TGL102
        H.append(Hi)
    return torch.stack(H, -1)
