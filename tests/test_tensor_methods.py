"""The static list of ``torch.Tensor`` attribute names matches the installed torch."""

import torch

from torchgradlint.analysis.tensor_methods import TENSOR_ATTRIBUTES


def test_every_public_tensor_attribute_is_listed():
    public = {n for n in dir(torch.Tensor) if not n.startswith("_")}
    missing = public - TENSOR_ATTRIBUTES
    assert not missing, f"regenerate analysis/tensor_methods.py: missing {sorted(missing)[:10]}"
    assert {"backward", "item", "detach", "mean", "float", "view"} <= TENSOR_ATTRIBUTES
    assert "get_loss" not in TENSOR_ATTRIBUTES
