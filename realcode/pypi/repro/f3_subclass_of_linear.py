# TGL201 FP (accelerate tests/test_big_modeling.py:491/516/593/620): `LinearModuleAndSubModule(torch.nn.Linear)`
# subclasses a mode-free torch layer and adds no dropout/batch norm; the model built from it is mode-free.
import torch


class LinearSub(torch.nn.Linear):
    def forward(self, x):
        return torch.nn.functional.linear(x, self.weight)


class ModelWithSubmodules(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.compute = LinearSub(5, 5)

    def forward(self, x):
        return self.compute(x)


def test_dispatch_model():
    model = ModelWithSubmodules()
    with torch.no_grad():
        expected = model(torch.ones(1, 5))   # TGL201 reported
    return expected
