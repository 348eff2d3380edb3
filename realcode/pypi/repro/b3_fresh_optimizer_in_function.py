# TGL001 FP (opacus test): both optimizers and their modules are built in this function; the only backward
# into `optimizer_gc`'s parameters is the one right before its single step, so nothing stale can be there.
import copy
import torch


def test_weight_update(sample_module, x, y):
    model_normal = copy.deepcopy(sample_module)
    model_gc = copy.deepcopy(sample_module)
    optimizer_normal = torch.optim.SGD(model_normal.parameters(), lr=1)
    optimizer_gc = torch.optim.SGD(model_gc.parameters(), lr=1)

    optimizer_normal.zero_grad()
    torch.nn.functional.cross_entropy(model_normal(x), y).backward()
    optimizer_normal.step()

    loss_gc = torch.nn.functional.cross_entropy(model_gc(x), y)
    loss_gc.backward()
    optimizer_gc.step()                  # TGL001 reported (at the first backward)
