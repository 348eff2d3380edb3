"""TGL007 module-built-in-forward on snippets the fixtures do not cover."""

import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.module_built_in_forward import ModuleBuiltInForward

HEADER = "import torch\nfrom torch import nn\n"


def cls(forward: str, header: str = HEADER, base: str = "nn.Module", extra: str = "") -> str:
    return (header + f"class M({base}):\n    def __init__(self):\n        super().__init__()\n"
            "        self.fc = None\n"
            "    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(forward), "        ") + extra)


def lines(src: str) -> list[int]:
    return [d.line for d in lint_source(src, "x.py", [ModuleBuiltInForward]).diagnostics]


@pytest.mark.parametrize("ctor", [
    "nn.Linear(4, 4)", "nn.Bilinear(4, 4, 4)", "nn.Conv2d(1, 1, 3)", "nn.ConvTranspose1d(1, 1, 3)",
    "nn.BatchNorm1d(4)", "nn.LayerNorm(4)", "nn.GroupNorm(2, 4)", "nn.GroupNorm(2, 4, affine=True)",
    "nn.InstanceNorm2d(4, affine=True)", "nn.Embedding(10, 4)", "nn.EmbeddingBag(10, 4)", "nn.LSTM(4, 4)",
    "nn.GRUCell(4, 4)", "nn.MultiheadAttention(4, 2)", "nn.TransformerEncoderLayer(4, 2)", "nn.PReLU()",
    "torch.nn.Linear(4, 4)",
])
def test_fires_on_parameterised_layers(ctor):
    assert lines(cls(f"return {ctor}(x)\n")) == [8]


@pytest.mark.parametrize("ctor", [
    "nn.ReLU()", "nn.Dropout(0.1)", "nn.MaxPool2d(2)", "nn.AdaptiveAvgPool2d(1)", "nn.Flatten()", "nn.Softmax(-1)",
    "nn.LayerNorm(4, elementwise_affine=False)", "nn.GroupNorm(2, 4, affine=False)", "nn.InstanceNorm2d(4)",
    "nn.BatchNorm1d(4, affine=False)", "nn.Identity()", "nn.Upsample(scale_factor=2)",
])
def test_silent_on_parameter_free_layers(ctor):
    assert lines(cls(f"return {ctor}(x)\n")) == []


@pytest.mark.parametrize("forward", [
    "if self.fc is None:\n    self.fc = nn.Linear(4, 4)\nreturn self.fc(x)\n",
    "self.fc = self.fc or nn.Linear(4, 4)\nreturn self.fc(x)\n",
    "self.layers.append(nn.Linear(4, 4))\nreturn x\n",
    "self.heads['a'] = nn.Linear(4, 4)\nreturn x\n",
    "self.add_module('fc2', nn.Linear(4, 4))\nreturn x\n",
    "setattr(self, 'fc2', nn.Linear(4, 4))\nreturn x\n",
    "fc = nn.Linear(4, 4)\nself.fc = fc\nreturn fc(x)\n",
    "fc = nn.Linear(4, 4)\nself.add_module('fc', fc)\nreturn fc(x)\n",
])
def test_silent_when_kept_on_the_module(forward):
    assert lines(cls(forward)) == []


def test_helper_called_from_forward_fires_and_builder_called_from_init_does_not():
    extra = ("    def _head(self, x):\n        return nn.Linear(4, 1)(x)\n"
             "    def _build(self):\n        return nn.Linear(4, 4)\n")
    assert lines(cls("return self._head(x)\n", extra=extra)) == [10]
    assert lines(cls("return x\n", extra=extra)) == []


def test_outside_forward_and_non_modules_are_silent():
    assert lines(HEADER + "def make():\n    return nn.Linear(4, 4)\n") == []
    assert lines(cls("return nn.Linear(4, 4)(x)\n", base="object")) == []
    assert lines(HEADER + "class P:\n    def forward(self, x):\n        return nn.Linear(4, 4)(x)\n") == []


@pytest.mark.parametrize("header", ["import mlx.nn as nn\n", "from flax import linen as nn\nimport torch\n"])
def test_other_frameworks_are_silent(header):
    assert lines(cls("return nn.Linear(4, 4)(x)\n", header=header)) == []


def test_aliases_and_lazy_hint():
    hdr = "import torch.nn as tnn\nfrom torch.nn import Conv2d as C\n"
    src = hdr + ("class M(tnn.Module):\n    def forward(self, x):\n"
                 "        return C(1, 1, 3)(tnn.LSTM(2, 2)(x)[0])\n")
    diags = lint_source(src, "x.py", [ModuleBuiltInForward]).diagnostics
    assert [d.line for d in diags] == [5, 5]
    by_layer = {("Conv2d" in d.message): f"{d.message} {d.detail}" for d in diags}
    assert "nn.LazyConv2d" in by_layer[True] and "Lazy" not in by_layer[False]


def test_imported_base_with_forward_counts_as_a_module():
    src = "from torch import nn\nfrom mylib import Block\nclass M(Block):\n    def forward(self, x):\n" \
          "        return nn.Linear(4, 4)(x)\n"
    assert lines(src) == [5]


@pytest.mark.parametrize("forward", [
    "deep_setattr(self.deps, 'k', nn.Linear(4, 4))\nreturn x\n",
    "dep = nn.Linear(4, 4)\nregister(self.deps, dep)\nreturn x\n",
    "if self.fc is None:\n    self._setup()\nreturn x\n",
    "if not self._built:\n    self._setup()\nreturn x\n",
])
def test_silent_when_handed_over_or_lazily_set_up(forward):
    extra = "    def _setup(self):\n        dep = nn.Linear(4, 4)\n        dep.weight.data.zero_()\n"
    assert lines(cls(forward, extra=extra)) == []


def test_layer_output_stored_in_a_local_still_fires():
    assert lines(cls("h = torch.relu(nn.Linear(4, 4)(x))\nreturn self.out(h)\n")) == [8]
    assert lines(cls("h = nn.Sequential(nn.Linear(4, 4), nn.ReLU())(x)\nreturn h\n")) == [8]


@pytest.mark.parametrize("layer", [
    "Linear", "Bilinear", "Conv1d", "Conv3d", "ConvTranspose2d", "BatchNorm1d", "SyncBatchNorm", "InstanceNorm3d",
    "LayerNorm", "GroupNorm", "RMSNorm", "Embedding", "EmbeddingBag", "RNN", "LSTM", "GRU", "RNNCell", "LSTMCell",
    "GRUCell", "MultiheadAttention", "Transformer", "TransformerEncoder", "TransformerDecoderLayer", "PReLU",
])
def test_prefilter_keeps_every_parameterised_layer(layer):
    src = f"from torch.nn import {layer} as L\nclass M:\n    def forward(self, x):\n        return L()(x)\n"
    assert ModuleBuiltInForward.may_fire(src)
    from torchgradlint.analysis.module_class_facts import _PARAMETERISED
    assert _PARAMETERISED.match(layer)


MEMOISED = """
import torch.nn as nn
from functools import wraps

def singleton(cache_key):
    def inner_fn(fn):
        @wraps(fn)
        def wrapper(self, *args, **kwargs):
            instance = getattr(self, cache_key)
            if instance is not None:
                return instance
            instance = fn(self, *args, **kwargs)
            {store}
            return instance
        return wrapper
    return inner_fn

class NetWrapper(nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net
        self.projector = None

    @singleton('projector')
    def _get_projector(self, hidden):
        return nn.Linear(hidden.shape[1], 128)

    def forward(self, x):
        h = self.net(x)
        return self._get_projector(h)(h)
"""


def test_a_layer_built_once_by_a_decorator_that_keeps_it_on_the_module_is_not_reported():
    # lucidrains/byol-pytorch: ``@singleton('projector')`` stores the projector with setattr
    assert lines(MEMOISED.format(store="setattr(self, cache_key, instance)")) == []
    assert lines(MEMOISED.format(store="pass")) == [26]  # a decorator that keeps nothing
