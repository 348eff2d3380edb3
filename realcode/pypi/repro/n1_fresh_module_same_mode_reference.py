# TGL201 FP (accelerate tests/test_hooks.py:397): a freshly built, never trained or loaded module in a unit
# test; its no_grad output is only compared with another forward of the same module in the same mode.
import torch
import torch.nn as nn
from torch.fx import symbolic_trace


class ModelForTest(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = nn.Linear(3, 4)
        self.batchnorm = nn.BatchNorm1d(4)
        self.linear2 = nn.Linear(4, 5)

    def forward(self, x):
        return self.linear2(self.batchnorm(self.linear1(x)))


def test_add_remove_hook_fx_graph_module():
    with torch.no_grad():
        test_model = ModelForTest()
        x = torch.randn(2, 3)
        output1 = test_model(x)          # TGL201 reported
        graph_model = symbolic_trace(test_model)
        output2 = graph_model(x)
        assert torch.allclose(output1, output2)
