"""What a class builds for the literal arguments one construction gives it.

A layer class often picks its layers by a constructor argument: improved
WGAN-GP's ``ResidualBlock(..., resample='down')`` builds ``nn.LayerNorm``,
``resample='up'`` builds ``nn.BatchNorm2d``. Judged as a whole, the class
holds batch norm; judged for ``resample='down'``, it holds none. This module
gives the literal arguments of a construction (:func:`literal_arguments`) and
the class with the branches of its ``__init__`` those arguments rule out
removed (:func:`pruned_class`), for the mode-layer analysis
(:mod:`torchgradlint.analysis.modes`) to read.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

import libcst as cst

from .literals import UNKNOWN, literal_value
from .model import ClassInfo, FileModel, Scope

def method_arguments(fn: cst.CSTNode,
                     call: cst.Call) -> "Optional[list[tuple[cst.Param, Optional[cst.BaseExpression]]]]":
    """Each parameter of the method ``fn`` after ``self`` with the value ``call``
    gives it (by position or keyword), else its default (``None`` when it has
    none); ``None`` when ``fn`` is no ``def`` or the call passes ``*args``/``**kwargs``."""
    if not isinstance(fn, cst.FunctionDef) or any(a.star for a in call.args):
        return None
    named = [*fn.params.posonly_params, *fn.params.params][1:]
    given = {p.name.value: a.value for p, a in zip(named, [a for a in call.args if a.keyword is None])}
    given.update({a.keyword.value: a.value for a in call.args if a.keyword is not None})
    return [(p, given.get(p.name.value, p.default)) for p in [*named, *fn.params.kwonly_params]]


def literal_arguments(model: FileModel, init: Optional[Scope], call: cst.Call) -> dict[str, object]:
    """The parameters of ``init`` (a class's ``__init__``) that the
    construction ``call`` fills with a literal, by position, keyword or
    default, and that ``__init__`` never rebinds (its only binding in the
    model is the parameter): ``{"resample": "down"}``. Empty when ``call``
    passes ``*args``/``**kwargs`` or ``init`` is none."""
    values = method_arguments(init.node, call) if init is not None else None
    if not values:
        return {}
    out = {}
    for p, node in values:
        value = literal_value(node)
        name = p.name.value
        if value is not UNKNOWN and all(b.kind == "param" for b in model.bindings_of(name, init)):
            out[name] = value
    return out


def decide(test: cst.BaseExpression, literals: dict[str, object]) -> Optional[bool]:
    """The truth of an ``if`` test given the parameters' literal values, when
    it follows from them alone: ``p == 'down'``, ``p != 'up'``, ``p is None``,
    ``p in ('a', 'b')``, ``p``, ``not ...``, ``and``/``or``; else ``None``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = decide(test.expression, literals)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        left, right = decide(test.left, literals), decide(test.right, literals)
        if isinstance(test.operator, cst.And):
            return False if False in (left, right) else (True if left is right is True else None)
        return True if True in (left, right) else (False if left is right is False else None)
    if isinstance(test, cst.Name):
        if test.value in literals:
            return bool(literals[test.value])
        return None
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        left, right = test.left, target.comparator
        if isinstance(right, cst.Name) and right.value in literals and not isinstance(left, cst.Name):
            left, right = right, left
        if not (isinstance(left, cst.Name) and left.value in literals):
            return None
        value = literals[left.value]
        op = target.operator
        if isinstance(op, (cst.In, cst.NotIn)):
            if not isinstance(right, (cst.Tuple, cst.List, cst.Set)):
                return None
            options = [literal_value(e.value) for e in right.elements]
            if any(o is UNKNOWN for o in options):
                return None
            return (value in options) is isinstance(op, cst.In)
        other = literal_value(right)
        if other is UNKNOWN:
            return None
        if isinstance(op, (cst.Is, cst.IsNot)) and other not in (None, True, False):
            return None  # ``is`` on strings or numbers: identity, not a value test
        if isinstance(op, (cst.Equal, cst.Is)):
            return value == other
        if isinstance(op, (cst.NotEqual, cst.IsNot)):
            return value != other
    return None


def _pruned_body(body: list, literals: dict[str, object]) -> list:
    """``body`` (statements) with every ``if`` chain whose tests the literals
    decide replaced by the branch that runs (recursively)."""
    out: list = []
    for stmt in body:
        if not isinstance(stmt, cst.If):
            out.append(stmt)
            continue
        node: Optional[cst.CSTNode] = stmt
        while isinstance(node, cst.If):
            verdict = decide(node.test, literals)
            if verdict is True:
                out += _pruned_body(list(node.body.body), literals) if isinstance(node.body, cst.IndentedBlock) \
                    else [node.body]
                break
            if verdict is None:
                out.append(node)  # undecided from here on: keep the rest of the chain as it is
                break
            node = node.orelse
        else:
            if isinstance(node, cst.Else):
                out += _pruned_body(list(node.body.body), literals) if isinstance(node.body, cst.IndentedBlock) \
                    else [node.body]
    return out


def pruned_class(node: cst.ClassDef, literals: dict[str, object]) -> cst.ClassDef:
    """The class ``node`` with its ``__init__``'s ``if`` chains decided by
    ``literals`` (:func:`decide`); a chain the literals do not decide stays."""
    if not literals or not isinstance(node.body, cst.IndentedBlock):
        return node
    stmts = []
    for stmt in node.body.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "__init__" \
                and isinstance(stmt.body, cst.IndentedBlock):
            kept = _pruned_body(list(stmt.body.body), literals) or [cst.SimpleStatementLine([cst.Pass()])]
            stmt = stmt.with_changes(body=stmt.body.with_changes(body=kept))
        stmts.append(stmt)
    return node.with_changes(body=node.body.with_changes(body=stmts))


def class_for_arguments(model: FileModel, info: ClassInfo, call: cst.Call) -> Optional[ClassInfo]:
    """The class ``info`` as the construction ``call`` builds it (its
    ``__init__`` pruned by the call's literal arguments), or ``None`` when
    the call gives no literal that decides a branch. Memoised per class and
    call on the model (which keeps the pruned tree alive for the analyses
    that memoise by node identity)."""
    def compute() -> Optional[ClassInfo]:
        literals = literal_arguments(model, info.methods.get("__init__"), call)
        if not literals or not isinstance(info.node, cst.ClassDef):
            return None
        pruned = pruned_class(info.node, literals)
        return None if pruned.deep_equals(info.node) else replace(info, node=pruned)
    return model.cached(("class-for-arguments", id(info.node), id(call)), compute)
