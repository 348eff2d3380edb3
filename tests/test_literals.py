"""The literal evaluator (``analysis.literals``): one reading of constants for every rule."""

import textwrap

import libcst as cst
import pytest

from torchgradlint.analysis import build_model
from torchgradlint.analysis.literals import (UNKNOWN, bound_literal, bound_literals, falsy_literal, is_infinite,
                                             is_literal, is_zero_literal, literal_bool, literal_value, number,
                                             plain_bindings)


def expr(text):
    return cst.parse_expression(text)


def model_of(src):
    src = textwrap.dedent(src)
    return build_model(cst.parse_module(src), src, "x.py")


def call(model, text):
    return next(c for c in model.calls if c.func_text == text)


@pytest.mark.parametrize("text, value", [
    ("'mean'", "mean"), ('"a" "b"', "ab"), ("b'x'", b"x"), ("1", 1), ("0x10", 16), ("1e-8", 1e-8),
    ("-1", -1), ("+2.5", 2.5), ("-1e-8", -1e-8), ("2j", 2j), ("True", True), ("False", False), ("None", None),
])
def test_literal_value_reads_constants(text, value):
    got = literal_value(expr(text))
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize("text", ["x", "f'{x}'", "'a' f'{x}'", "-x", "not True", "1 + 1", "[1]", "float('inf')",
                                  "self.eps"])
def test_literal_value_leaves_the_rest_unknown(text):
    assert literal_value(expr(text)) is UNKNOWN


def test_literal_value_of_nothing_is_unknown():
    assert literal_value(None) is UNKNOWN
    assert repr(UNKNOWN) == "UNKNOWN"


def test_predicates():
    assert is_literal(expr("False"), False) and not is_literal(expr("0"), False)
    assert is_literal(expr("None"), None) and not is_literal(expr("True"), False)
    assert literal_bool(expr("True")) is True and literal_bool(expr("False")) is False
    assert literal_bool(expr("1")) is None and literal_bool(None) is None
    assert number(expr("-3")) == -3.0 and number(expr("True")) is None and number(expr("'1'")) is None
    assert all(is_zero_literal(expr(t)) for t in ("0", "0.0", "0.", "0x0", "0o0"))
    assert not is_zero_literal(expr("0.1")) and not is_zero_literal(expr("False"))
    assert all(falsy_literal(expr(t)) for t in ("None", "False", "0"))
    assert not falsy_literal(expr("1")) and not falsy_literal(expr("''"))


@pytest.mark.parametrize("text, infinite", [
    ("float('inf')", True), ('float("Infinity")', True), ("float('-inf')", True), ("math.inf", True),
    ("torch.inf", True), ("np.inf", True), ("numpy.inf", True), ("float('1e3')", False), ("float('x')", False),
    ("float(x)", False), ("1e6", False), ("inf", False),
])
def test_is_infinite(text, infinite):
    model = model_of(f"import math, torch\nimport numpy as np\nclip({text})\n")
    assert is_infinite(model, call(model, "clip").node.args[0].value) is infinite


def test_is_infinite_follows_imports():
    model = model_of("from math import inf as INF\nclip(INF)\n")
    assert is_infinite(model, call(model, "clip").node.args[0].value)


def test_bound_literal_follows_a_module_constant():
    model = model_of("""
        EPS = 1e-8
        NAME: str = "g.pt"
        opt(eps=EPS, f=NAME, n=n)
    """)
    args = {a.keyword.value: a.value for a in call(model, "opt").node.args}
    assert bound_literal(model, args["eps"]) == 1e-8
    assert bound_literal(model, args["f"]) == "g.pt"
    assert bound_literal(model, args["n"]) is UNKNOWN  # never bound


def test_bound_literals_gives_every_value_and_bound_literal_only_an_agreed_one():
    model = model_of("""
        if fast:
            ACCUM = 1
        else:
            ACCUM = 0
        SAME = 2
        SAME = 2
        loop(ACCUM, SAME)
    """)
    accum, same = (a.value for a in call(model, "loop").node.args)
    assert bound_literals(model, accum) == [1, 0]
    assert bound_literal(model, accum) is UNKNOWN
    assert bound_literal(model, same) == 2


@pytest.mark.parametrize("binding", ["x = f()", "x += 1", "x, y = f()", "for x in range(3): pass",
                                     "def g(x=1): pass\nx = 1", "import x"])
def test_a_binding_that_is_no_plain_literal_assignment_makes_the_name_unknown(binding):
    model = model_of(f"x = 1\n{binding}\nuse(x)\n")
    arg = call(model, "use").node.args[0].value
    assert bound_literals(model, arg) is None
    assert bound_literal(model, arg) is UNKNOWN


def test_at_counts_only_the_bindings_that_reach_it():
    model = model_of("""
        def f():
            eps = 1e-3
            opt(eps)
            eps = compute()
    """)
    site = call(model, "opt")
    arg = site.node.args[0].value
    assert bound_literal(model, arg, site) == 1e-3
    assert bound_literal(model, arg) is UNKNOWN  # every binding in the file: one is a call
    assert [b.value.value for b in plain_bindings(model, "eps", site)] == ["1e-3"]
    assert len(plain_bindings(model, "eps")) == 2
