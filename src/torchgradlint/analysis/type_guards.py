"""Type guards: what an ``if`` around a fact says about whether a name holds a tensor.

Code that accepts a tensor or a number tests which one it got and handles
each in its own branch (torch-ngp's ``if torch.is_tensor(interval):
ctx.save_for_backward(..., interval) else: ctx.interval = interval``). A rule
that judges a name as a tensor from the rest of the scope must not judge it
so inside the branch where the test says it is none.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .model import FileModel, _Located, enclosing_ifs, if_branches

#: qualified names whose ``isinstance`` test means "is a tensor"
TENSOR_TYPES = frozenset({
    "torch.Tensor", "torch.FloatTensor", "torch.DoubleTensor", "torch.HalfTensor", "torch.LongTensor",
    "torch.IntTensor", "torch.BoolTensor", "torch.ByteTensor", "torch.nn.Parameter",
    "torch.nn.parameter.Parameter",
})
#: types no tensor is an instance of
NON_TENSOR_TYPES = frozenset({
    "int", "float", "bool", "complex", "str", "bytes", "list", "tuple", "dict", "set", "numbers.Number",
    "numbers.Real", "numbers.Integral", "numpy.ndarray", "numpy.number", "numpy.floating", "numpy.integer",
})


def _type_verdict(model: FileModel, types: cst.BaseExpression) -> Optional[bool]:
    """Whether ``isinstance(x, types)`` being true means a tensor (``True``),
    no tensor (``False``), or either (``None``)."""
    elements = [e.value for e in types.elements] if isinstance(types, cst.Tuple) else [types]
    names = [model.qualname(e) for e in elements]
    if names and all(n in TENSOR_TYPES for n in names):
        return True
    if names and all(n in NON_TENSOR_TYPES for n in names):
        return False
    return None


def guard(model: FileModel, test: cst.BaseExpression, name: str) -> Optional[bool]:
    """What ``test`` being true says about ``name``: a tensor (``True``), no
    tensor (``False``), or nothing (``None``). Understood: ``torch.is_tensor(name)``,
    ``isinstance(name, torch.Tensor)`` (or a tuple of tensor types, or of
    number/container types), ``not``, and ``and``/``or`` of those."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        inner = guard(model, test.expression, name)
        return None if inner is None else not inner
    if isinstance(test, cst.BooleanOperation):
        left, right = guard(model, test.left, name), guard(model, test.right, name)
        if isinstance(test.operator, cst.And):  # both hold: either one's word is enough
            return left if right is None else right if left is None else (left if left == right else None)
        return left if left == right else None  # ``or``: only where both say the same
    if not isinstance(test, cst.Call):
        return None
    args = [a.value for a in test.args if a.keyword is None and not a.star]
    if not args or not (isinstance(args[0], cst.Name) and args[0].value == name):
        return None
    qn = model.qualname(test.func)
    if qn == "torch.is_tensor" and len(args) == 1:
        return True
    if isinstance(test.func, cst.Name) and test.func.value == "isinstance" and len(args) == 2:
        return _type_verdict(model, args[1])
    return None


def not_a_tensor_at(model: FileModel, name: str, at: _Located) -> bool:
    """Whether an ``if`` chain around ``at`` (in its scope) says ``name`` is
    no tensor there: ``at`` lies in a branch whose own test says so, or after
    tests (``if``/``elif``) that, being false, say so."""
    for stmt, suite in enclosing_ifs(at):
        node: Optional[cst.CSTNode] = stmt
        for branch in if_branches(stmt):
            test = node.test if isinstance(node, cst.If) else None
            if branch is suite:
                if test is not None and guard(model, test, name) is False:
                    return True
                break
            if test is not None and guard(model, test, name) is True:
                return True  # reached only where this test failed: no tensor
            node = node.orelse if isinstance(node, cst.If) else None
    return False
