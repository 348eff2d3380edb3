# TGL201 FP (accelerate tests/test_hooks.py:462): `_ = model(x)` discards the output (the test only checks
# that the casting hooks run); the rule already exempts a bare discarded call, not an assignment to `_`.
import torch
import torch.nn as nn


class ModelForTest(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.batchnorm(self.linear1(x))


def test_layerwise_upcasting_inference(storage_dtype, compute_dtype):
    test_model = ModelForTest()
    attach_layerwise_casting_hooks(test_model, storage_dtype=storage_dtype, compute_dtype=compute_dtype)
    with torch.no_grad():
        _ = test_model(torch.randn(2, 3))   # TGL201 reported
