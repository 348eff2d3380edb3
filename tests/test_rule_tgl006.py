"""TGL006 unregistered-submodule on snippets the fixtures do not cover."""

import re
import textwrap

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.rules.unregistered_submodule import UnregisteredSubmodule

HEADER = "import torch\nimport torch.nn.functional as F\nfrom torch import nn\n"


def cls(init: str, forward: str = "return self.layers[0](x)", header: str = HEADER, base: str = "nn.Module",
        extra: str = "") -> str:
    return (header + f"class M({base}):\n    def __init__(self):\n        super().__init__()\n"
            + textwrap.indent(textwrap.dedent(init), "        ")
            + f"    def forward(self, x):\n        {forward}\n" + extra)


def lines(src: str) -> list[int]:
    return [d.line for d in lint_source(src, "x.py", [UnregisteredSubmodule]).diagnostics]


@pytest.mark.parametrize("init", [
    "self.layers = [nn.Linear(2, 2), nn.ReLU()]\n",
    "self.layers = (nn.Conv2d(1, 1, 3),)\n",
    "self.layers = [nn.Linear(2, 2) for _ in range(3)]\n",
    "self.layers = [nn.Linear(2, 2).cuda() for _ in range(3)]\n",  # DomainBed's TRM heads
    "self.layers = [nn.Linear(2, 2).to('cuda').train()]\n",
    "self.layers = {'a': nn.Linear(2, 2)}\n",
    "self.layers = {k: nn.Embedding(3, 2) for k in 'ab'}\n",
    "self.layers = [nn.Dropout(0.5)]\n",  # no parameters, but .eval() never reaches it
    "self.layers = [torch.randn(2, requires_grad=True)]\n",
    "self.layers = torch.zeros(2, requires_grad=True)\n",
    "self.layers = torch.randn(2).requires_grad_()\n",
    "self.layers = torch.autograd.Variable(torch.randn(2), requires_grad=True)\n",
    "self.layers: list = [nn.LSTM(2, 2)]\n",
])
def test_fires(init):
    assert lines(cls(init)) == [7]


def test_list_built_with_append_and_plus_equals():
    assert lines(cls("self.layers = []\nfor i in range(3):\n    self.layers.append(nn.Linear(2, 2))\n")) == [7]
    assert lines(cls("self.layers = []\nself.layers += [nn.Linear(2, 2)]\n")) == [7]
    assert lines(cls("ls = []\nfor i in range(3):\n    layer = nn.Linear(2, 2)\n    ls.append(layer)\n"
                     "self.layers = ls\n")) == [11]


def test_own_module_class_in_a_list():
    extra = "class Block(nn.Module):\n    def __init__(self):\n        super().__init__()\n" \
            "        self.fc = nn.Linear(2, 2)\n"
    assert lines(cls("self.layers = [Block(), Block()]\n", extra=extra)) == [7]


def test_never_read_is_flagged_and_read_only_in_init_is_not():
    assert lines(cls("self.layers = [nn.Linear(2, 2)]\n", forward="pass")) == [7]
    assert lines(cls("self.layers = [nn.Linear(2, 2)]\nfor l in self.layers:\n    nn.init.zeros_(l.weight)\n",
                     forward="pass")) == []


def test_read_in_another_method_is_flagged():
    extra = "    def encode(self, x):\n        return self.layers[0](x)\n"
    assert lines(cls("self.layers = [nn.Linear(2, 2)]\n", forward="return self.encode(x)", extra=extra)) == [7]


@pytest.mark.parametrize("init", [
    "self.layers = nn.ModuleList([nn.Linear(2, 2)])\n",
    "self.layers = [nn.Linear(2, 2)]\nself.net = nn.Sequential(*self.layers)\n",
    "self.layers = [nn.Linear(2, 2)]\nself.layers = nn.ModuleList(self.layers)\n",
    "ls = [nn.Linear(2, 2)]\nself.layers = ls\nself.ml = nn.ModuleList(ls)\n",
    "self.layers = [F.relu, torch.tanh]\n",
    "self.layers = [nn.ReLU(), nn.Tanh(), nn.MaxPool2d(2)]\n",
    "self.layers = [self.fc1, self.fc2]\n",
    "self.layers = torch.zeros(2)\n",
    "self.layers = torch.zeros(2, requires_grad=False)\n",
    "self.layers = nn.Parameter(torch.zeros(2))\n",
    "self.layers = torch.zeros(2, requires_grad=True)\nself.register_buffer('b', self.layers)\n",
    "self.layers = [nn.Linear(2, 2)]\nfor i, l in enumerate(self.layers):\n    self.add_module(str(i), l)\n",
    "self.layers = []\nfor i in range(2):\n    l = nn.Linear(2, 2)\n    setattr(self, f'l{i}', l)\n"
    "    self.layers.append(l)\n",
    "self.layers = []\nfor i in range(2):\n    l = nn.Linear(2, 2)\n    self.__setattr__(f'l{i}', l)\n"
    "    self.layers.append(l)\n",  # rlkit's Mlp
    "l = nn.Linear(2, 2)\nself.fc = l\nself.layers = [l]\n",
    "self.layers = [nn.Linear(2, 2)]\nself.block = Wrapper(self.layers)\n",
    "self.layers = [nn.CrossEntropyLoss()]\n",
])
def test_silent(init):
    assert lines(cls(init)) == []


def test_tensor_handed_to_its_own_optimizer_is_silent():
    init = "self.layers = torch.zeros(1, requires_grad=True)\nself.opt = torch.optim.Adam([self.layers])\n"
    assert lines(cls(init)) == []


def test_class_that_lists_its_own_parameters_is_silent():
    extra = "    def parameters(self):\n        return [self.layers]\n"
    assert lines(cls("self.layers = torch.zeros(2, requires_grad=True)\n", extra=extra)) == []


@pytest.mark.parametrize("header", [
    "import mlx.nn as nn\nimport mlx.core as torch\n",
    "from flax import linen as nn\nimport torch\n",
    "import haiku as hk\nimport torch\nfrom haiku import nn\n",
])
def test_other_frameworks_are_silent(header):
    assert lines(cls("self.layers = [nn.Linear(2, 2)]\n", header=header)) == []


def test_non_module_classes_are_silent():
    assert lines(cls("self.layers = [nn.Linear(2, 2)]\n", base="object")) == []
    src = HEADER + "class Holder:\n    def __init__(self):\n        self.layers = [nn.Linear(2, 2)]\n"
    assert lines(src) == []


def test_aliases():
    hdr = "import torch as T\nimport torch.nn as tnn\nfrom torch.nn import Linear\n"
    src = hdr + ("class M(tnn.Module):\n    def __init__(self):\n        super().__init__()\n"
                 "        self.a = [Linear(2, 2)]\n        self.w = T.ones(1, requires_grad=True)\n"
                 "    def forward(self, x):\n        return self.a[0](x) * self.w\n")
    assert lines(src) == [7, 8]


def test_message_names_the_wrapper():
    (d,) = lint_source(cls("self.layers = {'a': nn.Linear(2, 2)}\n"), "x.py", [UnregisteredSubmodule]).diagnostics
    text = f"{d.message} {d.detail}"  # the short message plus its detail
    assert "nn.ModuleDict" in text and "`nn.Linear`" in text


BLOCK = """
class Block(nn.Module):
    def __init__(self, k, layer=None):
        super().__init__()
        self.k = k
{body}
    def forward(self, x):
        return {forward}
"""


@pytest.mark.parametrize("body, forward, fires", [
    ("        self.pool = nn.AvgPool1d(k)\n", "self.pool(x) * (self.k - 1) // 2", False),  # stateless
    ("        self.act = nn.ReLU()\n", "self.act(x)", False),
    ("        self.pool = nn.Conv1d(1, 1, k)\n", "self.pool(x)", True),  # parameters
    ("        self.drop = nn.Dropout(0.1)\n", "self.drop(x)", True),  # train/eval behaviour
    ("        self.norm = nn.BatchNorm1d(k)\n", "self.norm(x)", True),  # buffers
    ("        self.layer = layer\n", "self.layer(x)", True),  # a module handed in may hold parameters
    ("        self.layer = make_layer(k)\n", "self.layer(x)", True),  # so may what a helper builds
    ("        self.w = nn.Parameter(torch.ones(k))\n", "x * self.w", True),
    ("        self.register_buffer('m', torch.zeros(k))\n", "x - self.m", True),
    ("", "x if self.training else x * 2", True),  # mode-dependent forward
])
def test_a_same_file_class_in_a_plain_list_matters_only_with_state(body, forward, fires):
    src = HEADER + BLOCK.format(body=body, forward=forward) + (
        "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.blocks = [Block(k) for k in (3, 5)]\n"
        "    def forward(self, x):\n        return sum(b(x) for b in self.blocks)\n")
    assert bool(lines(src)) is fires


def test_a_stateless_class_derived_from_a_stateful_one_is_stateful():
    src = HEADER + BLOCK.format(body="        self.fc = nn.Linear(k, k)\n", forward="self.fc(x)") + (
        "class Child(Block):\n    pass\n"
        "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.blocks = [Child(k) for k in (3, 5)]\n"
        "    def forward(self, x):\n        return sum(b(x) for b in self.blocks)\n")
    assert lines(src) != []


def test_a_tensor_only_initialised_in_init_is_unregistered():
    # rasbt's machine-learning-book ch13: ``nn.init.xavier_normal_(self.w1)`` is no use of the tensor
    assert lines(HEADER + "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                 "        self.w1 = torch.empty(2, 3, requires_grad=True)\n"
                 "        nn.init.xavier_normal_(self.w1)\n"
                 "        self.w2 = torch.empty(2, requires_grad=True)\n"
                 "        self.w2.uniform_(-1, 1)\n") == [7, 9]
    # a tensor used while building (the value read) stays silent
    assert lines(HEADER + "class M(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                 "        self.w1 = torch.empty(2, 3, requires_grad=True)\n"
                 "        self.fc = nn.Linear(2, 3)\n        self.fc.weight.data.copy_(self.w1)\n") == []


def test_every_definition_of_a_class_defined_twice_is_checked():
    # a notebook that redefines ``MyModule`` in a later cell: the first definition is checked too
    first = ("class MyModule(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.w = torch.zeros(2, requires_grad=True)\n"
             "    def forward(self, x):\n        return x * self.w\n")
    second = ("class MyModule(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
              "        self.w = nn.Parameter(torch.zeros(2))\n"
              "    def forward(self, x):\n        return x * self.w\n")
    assert lines(HEADER + first + second) == [7]


@pytest.mark.parametrize("value, fires", [
    ("nn.Parameter(torch.tensor([10.])).to(loss_device)", True),  # Real-Time-Voice-Cloning's encoder
    ("nn.Parameter(torch.zeros(3)).cuda()", True),
    ("nn.Parameter(torch.zeros(3)).double()", True),
    ("nn.Parameter(torch.zeros(3).to(loss_device))", False),  # the converted tensor wrapped: a parameter
    ("nn.Parameter(torch.zeros(3))", False),
    ("nn.Parameter(torch.ones(3)).float()", False),  # float32 already: returns the parameter (rasbt's RMSNorm)
    ("nn.Parameter(torch.ones(3, dtype=torch.half)).float()", True),
])
def test_a_parameter_converted_after_wrapping_is_a_plain_tensor(value, fires):
    src = (HEADER + "class M(nn.Module):\n    def __init__(self, loss_device):\n        super().__init__()\n"
           f"        self.w = {value}\n    def forward(self, x):\n        return x * self.w\n")
    found = lint_source(src, "x.py", [UnregisteredSubmodule]).diagnostics
    assert [d.line for d in found] == ([7] if fires else [])
    if fires:
        assert "moved to another device or dtype" in found[0].message + (found[0].detail or "")



HIGHWAY = """
import torch.nn as nn
import torch.nn.functional as F

class Highway(nn.Module):
    def __init__(self, size, num_layers, f):
        super().__init__()
        self.num_layers = num_layers
        self.linear = [nn.Linear(size, size) for _ in range(num_layers)]
        for i, module in enumerate(self.linear):
            self._add_to_parameters(module.parameters(), 'linear_module_{{}}'.format(i))
        self.gate = [nn.Linear(size, size) for _ in range(num_layers)]
        for i, module in enumerate(self.gate):
            {register}
        self.f = f

    def forward(self, x):
        for layer in range(self.num_layers):
            gate = F.sigmoid(self.gate[layer](x))
            x = gate * self.f(x) + (1 - gate) * self.linear[layer](x)
        return x

    def _add_to_parameters(self, parameters, name):
        for i, parameter in enumerate(parameters):
            self.register_parameter(name='{{}}-{{}}'.format(name, i), param=parameter)
"""


def test_a_list_whose_elements_parameters_are_registered_by_hand_is_registered():
    # kefirski/pytorch_RVAE's Highway: each layer's parameters go through register_parameter
    assert lines(HIGHWAY.format(register="self._add_to_parameters(module.parameters(), 'gate_{}'.format(i))")) == []
    assert lines(HIGHWAY.format(register="print(module)")) == [12]  # the other loop registers only ``linear``


@pytest.mark.parametrize("init, fires", [
    # metehancekic/pytorch-tutorials: slots filled one by one
    ("self.summers = [None] * 3\nfor i in range(3):\n    self.summers[i] = nn.Linear(4, 1)\n", True),
    ("self.heads = {}\nfor k in ('a', 'b'):\n    self.heads[k] = nn.Linear(4, 1)\n", True),
    ("self.summers = 3 * [None]\nself.summers[0] = nn.Linear(4, 1)\n", True),
    ("self.summers = [None] * 3\nfor i in range(3):\n    self.summers[i] = 0.5 * i\n", False),
    # dgl's R-GCN: a plain dict of foreign embeddings in one branch, a ModuleDict in the other
    ("if sparse:\n    self.layers = {}\n    self.layers['a'] = make_foreign()\n"
     "else:\n    self.layers = nn.ModuleDict()\n    self.layers['a'] = nn.Embedding(4, 2)\n", False),
    # a local container filled slot by slot, then stored on ``self`` (before or after the slots are filled)
    ("layers = [None] * 3\nfor i in range(3):\n    layers[i] = nn.Linear(4, 1)\nself.summers = layers\n", True),
    ("heads = {}\nfor k in ('a', 'b'):\n    heads[k] = nn.Linear(4, 1)\nself.heads = heads\n", True),
    ("layers = [None] * 3\nself.summers = layers\nlayers[0] = nn.Linear(4, 1)\n", True),
    ("layers = [None] * 3\nfor i in range(3):\n    layers[i] = nn.Linear(4, 1)\nself.summers = nn.ModuleList(layers)\n",
     False),
    ("layers = [None] * 3\nfor i in range(3):\n    layers[i] = 0.5 * i\nself.summers = layers\n", False),
    # another list of the same name, filled after the stored one was rebound
    ("layers = [None] * 3\nself.summers = layers\nlayers = [None] * 3\nlayers[0] = nn.Linear(4, 1)\n"
     "self.other = nn.ModuleList(layers)\n", False),
])
def test_layers_stored_into_the_slots_of_a_plain_container(init, fires):
    attr = re.search(r"self\.\w+", init).group()  # the attribute the container ends in
    assert bool(lines(cls(init, forward=f"return {attr}[0](x)"))) is fires


BLENDER = """
import torch
import torch.nn as nn


class Blender(nn.Module):
    def __init__(self, builders):
        super().__init__()
        self.models = []
        for build in builders:
            model = nn.DataParallel(build())
            model.eval()
{freeze}            self.models.append(model)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(torch.cat([m(x) for m in self.models], 1))
"""


@pytest.mark.parametrize("freeze, fires", [
    # JunhongXu's planet blender: pretrained members loaded, frozen and kept out of the parent on purpose
    ("            for p in model.parameters():\n                p.requires_grad = False\n", False),
    ("            model.requires_grad_(False)\n", False),
    ("", True),  # trainable members the optimizer of the blender never sees
    ("            model.requires_grad_(False)\n            model.requires_grad_(True)\n", True),  # unfrozen again
])
def test_frozen_members_kept_in_a_plain_list_are_deliberate(freeze, fires):
    src = BLENDER.format(freeze=freeze)
    assert bool(lines(src)) is fires


@pytest.mark.parametrize("forward, fires", [
    # an output or an element passed on is no hand-over of the container
    ("return self.head(self.models[0](x))", True),
    ("return self.head(torch.cat([m(x) for m in self.models], 1))", True),
    ("return Fuse(self.models)(x)", False),  # the container itself: the callee may register it
    ("return Fuse([self.models, self.head])(x)", False),
    ("return Fuse(self.models[0])(x)", False),  # an element handed to an unknown callee
])
def test_only_the_container_itself_handed_to_an_unknown_callee_counts(forward, fires):
    src = ("import torch\nfrom torch import nn\n\n\nclass M(nn.Module):\n    def __init__(self):\n"
           "        super().__init__()\n        self.models = []\n        self.models.append(nn.Linear(4, 4))\n"
           "        self.head = nn.Linear(4, 2)\n\n    def forward(self, x):\n        " + forward + "\n")
    assert bool(lines(src)) is fires
