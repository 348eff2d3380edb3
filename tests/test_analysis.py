"""The analysis layer: names, grad-mode regions, scopes, bindings, callees."""

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from torchgradlint.analysis import GradMode, build_model
from torchgradlint.analysis.builder import _STATEMENTS, _SUITES
from torchgradlint.analysis.names import ImportTable, dotted_name
from torchgradlint.analysis.tree import NODE_TYPES, child_fields, node_types, walk


def model_of(src):
    src = textwrap.dedent(src)
    return build_model(cst.parse_module(src), src, "x.py")


def call(model, text, nth=0):
    return [c for c in model.calls if c.func_text == text][nth]


@pytest.mark.parametrize("imports, expr, expected", [
    ("import torch as T", "T.no_grad", "torch.no_grad"),
    ("from torch import no_grad", "no_grad", "torch.no_grad"),
    ("from torch.autograd import grad", "grad", "torch.autograd.grad"),
    ("import torch.nn.functional as F", "F.cross_entropy", "torch.nn.functional.cross_entropy"),
    ("from torch.nn import functional as F", "F.mse_loss", "torch.nn.functional.mse_loss"),
    ("from torch import autograd", "autograd.no_grad", "torch.no_grad"),
    ("import torch", "torch.autograd.grad_mode.no_grad", "torch.no_grad"),
    ("import numpy as np", "np.sum", "numpy.sum"),
    ("", "torch.no_grad", "torch.no_grad"),
])
def test_import_aliases(imports, expr, expected):
    table = ImportTable()
    for stmt in cst.parse_module(imports).body:
        table.add(stmt.body[0])
    assert table.qualify(expr) == expected


def test_relative_and_star_imports_bind_nothing():
    table = ImportTable()
    table.add(cst.parse_statement("from .utils import no_grad").body[0])
    table.add(cst.parse_statement("from torch import *").body[0])
    assert table.qualify("no_grad") == "no_grad"


def test_dotted_name():
    assert dotted_name(cst.parse_expression("a.b.c")) == "a.b.c"
    assert dotted_name(cst.parse_expression("a().b")) is None


def test_with_regions_nesting_and_aliases():
    m = model_of("""
        import torch as T
        from torch import no_grad
        y0 = f(0)
        with no_grad():
            y1 = f(1)
            with T.enable_grad():
                y2 = f(2)
            with T.set_grad_enabled(flag):
                y3 = f(3)
        with T.inference_mode():
            y4 = f(4)
        with T.inference_mode(False):
            y5 = f(5)
    """)
    modes = [m.grad_mode(call(m, "f", i)) for i in range(6)]
    assert modes == [GradMode.ENABLED, GradMode.DISABLED, GradMode.ENABLED, GradMode.UNKNOWN,
                     GradMode.DISABLED, GradMode.ENABLED]


def test_monai_mode_managers_set_grad_mode():
    m = model_of("""
        import torch
        from monai.networks.utils import eval_mode, train_mode
        import monai
        with eval_mode(net):
            y0 = f(0)
            with train_mode(net):
                y1 = f(1)
        with monai.networks.eval_mode(net):
            y2 = f(2)
    """)
    modes = [m.grad_mode(call(m, "f", i)) for i in range(3)]
    assert modes == [GradMode.DISABLED, GradMode.ENABLED, GradMode.DISABLED]


def test_decorators_and_nested_defs_do_not_inherit():
    m = model_of("""
        import torch
        @torch.no_grad()
        def a():
            f(1)
            def inner():
                f(2)
            g = lambda: f(3)
        @torch.inference_mode
        def b():
            f(4)
        with torch.no_grad():
            def c():
                f(5)
    """)
    assert m.grad_mode(call(m, "f", 0)) is GradMode.DISABLED
    assert m.grad_mode(call(m, "f", 1)) is GradMode.UNKNOWN  # never called in the file
    assert m.grad_mode(call(m, "f", 2)) is GradMode.UNKNOWN
    assert m.grad_mode(call(m, "f", 3)) is GradMode.DISABLED
    assert m.grad_mode(call(m, "f", 4)) is GradMode.UNKNOWN


def test_statement_set_grad_enabled_switches_the_rest_of_the_block():
    m = model_of("""
        import torch
        def run():
            f(0)
            torch.set_grad_enabled(False)
            f(1)
            if x:
                f(2)
        run()
        f(3)
    """)
    assert [m.grad_mode(call(m, "f", i)) for i in range(4)] == [
        GradMode.ENABLED, GradMode.DISABLED, GradMode.DISABLED, GradMode.ENABLED]


def test_function_mode_follows_agreeing_callers():
    m = model_of("""
        import torch
        def evaluate():
            f(0)
        def mixed():
            f(1)
        with torch.no_grad():
            evaluate()
            mixed()
        mixed()
    """)
    assert m.grad_mode(call(m, "f", 0)) is GradMode.DISABLED  # every caller is under no_grad
    assert m.grad_mode(call(m, "f", 1)) is GradMode.UNKNOWN  # callers disagree


def test_loops_scopes_and_orders():
    m = model_of("""
        for a in xs:
            while b:
                f(0)
            f(1)
        f(2)
        class Net:
            def forward(self):
                f(3)
    """)
    outer, inner = m.loops
    assert inner.parent is outer
    assert [len(call(m, "f", i).loops) for i in range(4)] == [2, 1, 0, 0]
    assert call(m, "f", 3).scope.qualname == "Net.forward"
    orders = [c.order for c in m.calls]
    assert orders == sorted(orders)
    assert all(outer.contains(call(m, "f", i).order) for i in (0, 1))
    assert not outer.contains(call(m, "f", 2).order)


def test_reaching_binding_requires_dominance():
    m = model_of("""
        loss = a()
        if c:
            loss = b()
        loss.backward()
        out = d()
        out.backward()
    """)
    assert m.reaching_binding("loss", call(m, "loss.backward")) is None  # ambiguous
    binding = m.reaching_binding("out", call(m, "out.backward"))
    assert binding is not None and isinstance(binding.value, cst.Call)


@pytest.mark.parametrize("branches, reaching", [
    ("if gpu:\n    out = b()\nelse:\n    out = c()", ["b()", "c()"]),  # every branch binds
    ("if gpu:\n    out = b()\nelif cpu:\n    out = c()\nelse:\n    out = d()", ["b()", "c()", "d()"]),
    ("if gpu:\n    out = b()", ["a()", "b()"]),  # no else: a() may reach
    ("if gpu:\n    out = b()\nelif cpu:\n    out = c()", ["a()", "b()", "c()"]),
    ("if gpu:\n    out = b()\nelse:\n    pass", ["a()", "b()"]),
    ("if gpu:\n    out = b()\nelse:\n    if x:\n        out = c()", ["a()", "b()", "c()"]),
])
def test_reaching_bindings_stop_at_an_if_chain_that_binds_in_every_branch(branches, reaching):
    # pytorch-relation-extraction: ``out = model(x)``, then ``out = out...tolist()`` on either device
    src = ("for data in loader:\n    out = a()\n" + textwrap.indent(branches, "    ")
           + "\n    for r in range(3):\n        use(out)\n")
    m = model_of(src)
    found = m.reaching_bindings("out", call(m, "use"))
    assert [m.module.code_for_node(b.value) for b in found] == reaching


def test_targets_unpacking_subscript_and_augassign():
    m = model_of("""
        out, (h, c) = rnn(x)
        d[k] = v
        total += loss
        self.best: float = 0.0
    """)
    a0, a1, a2, a3 = m.assigns
    assert [t.text for t in a0.targets] == ["out", "h", "c"] and a0.unpacked
    assert a1.targets[0].kind == "subscript" and a1.targets[0].container == "d"
    assert a2.kind == "augassign" and a2.op == "+="
    assert a3.kind == "annassign" and a3.targets[0].text == "self.best"


def test_resolve_callee_functions_methods_and_inheritance():
    m = model_of("""
        def helper(): pass
        class Base:
            def reset(self): pass
        class Trainer(Base):
            def step(self):
                self.reset()
                helper()
                Base.reset(self)
                obj.reset()
    """)
    names = lambda c: [s.qualname for s in m.resolve_callee(c)]
    assert names(call(m, "self.reset")) == ["Base.reset"]
    assert names(call(m, "helper")) == ["helper"]
    assert names(call(m, "Base.reset")) == ["Base.reset"]
    assert names(call(m, "obj.reset")) == []
    assert [c.func_text for c in m.callers_of(m.classes["Base"].methods["reset"])] == ["self.reset", "Base.reset"]


def test_walk_is_in_source_order_and_skips_whitespace():
    module = cst.parse_module("@dec(1)\ndef f(a=g(2)):\n    return h(3 if t(4) else 5)\n")
    calls = [n.func.value for n in walk(module) if isinstance(n, cst.Call)]
    assert calls == ["dec", "g", "h", "t"]
    assert not any(isinstance(n, (cst.SimpleWhitespace, cst.Newline, cst.EmptyLine)) for n in walk(module))


def test_node_type_sets_agree_with_isinstance():
    # The walk and the builder test node types by set lookup
    # (``tree.node_types``) instead of ``isinstance`` against LibCST's ABC
    # classes: on every node of every fixture, and on every value of every
    # field the walk reads, both answers must agree.
    sources = sorted(Path(__file__).resolve().parent.parent.joinpath("fixtures").rglob("*.py"))
    assert sources
    checked = 0
    for path in sources:
        for node in walk(cst.parse_module(path.read_text())):
            kind = type(node)
            assert (kind in _SUITES) is isinstance(node, (cst.IndentedBlock, cst.SimpleStatementSuite))
            assert (kind in _STATEMENTS) is isinstance(node, (cst.BaseSmallStatement, cst.BaseCompoundStatement))
            for name in child_fields(kind):
                value = getattr(node, name)
                assert (type(value) in NODE_TYPES) is isinstance(value, cst.CSTNode)
                checked += 1
    assert checked > 1000
    assert node_types(cst.BaseSmallStatement) >= {cst.Expr, cst.Pass, cst.Return, cst.Assign}
    assert cst.FunctionDef not in node_types(cst.BaseSmallStatement)


_TRAINER = """
import torch
from torch import nn

class Unet(nn.Module):
    def __init__(self):
        super().__init__()
        self.channels = 3
        self.conv = nn.Conv2d(3, 3, 1)

class Diffusion(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model
        self.channels = model.channels
        self.image_size = 32
        self.num_timesteps = 1000

{other}
class Trainer:
    def __init__(self, diffusion_model):
        self.model = diffusion_model
        self.size = diffusion_model.image_size
        self.steps = diffusion_model.num_timesteps

    def train(self, x):
        return self.model(x)
"""


def _self_model_class(src: str, cls: str):
    from torchgradlint.analysis import modes

    m = model_of(src)
    call = next(c for c in m.calls if c.func_text == "self.model" and m.enclosing_function(c.scope).class_name == cls)
    return modes.instance_class(m, "self.model", call)


def test_constructor_parameter_class_by_its_attributes():
    assert _self_model_class(_TRAINER.replace("{other}", ""), "Trainer") == "Diffusion"


def test_constructor_parameter_class_is_unknown_when_two_classes_fit():
    other = ("class Flow(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
             "        self.image_size = 32\n        self.num_timesteps = 10\n")
    assert _self_model_class(_TRAINER.replace("{other}", other), "Trainer") is None


def test_self_attribute_is_resolved_per_owning_class():
    src = _TRAINER.replace("{other}", "") + (
        "\nclass Sampler(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.model = Unet()\n\n    def forward(self, x):\n        return self.model(x)\n")
    assert _self_model_class(src, "Sampler") == "Unet"
    assert _self_model_class(src, "Trainer") == "Diffusion"
