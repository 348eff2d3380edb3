# TGL201 FP (accelerate tests/test_big_modeling.py:403/440): an nn.Sequential of nn.Linear only has no
# mode-dependent layer; being freshly built (training mode) changes nothing.
from collections import OrderedDict

import torch
import torch.nn as nn


def test_dispatch_model_tied_weights_memory():
    model = nn.Sequential(OrderedDict([("linear0", nn.Linear(50, 50, bias=False)),
                                       ("linear1", nn.Linear(50, 50, bias=False))]))
    x = torch.randn(5, 50)
    with torch.no_grad():
        expected = model(x)              # TGL201 reported
    return expected
