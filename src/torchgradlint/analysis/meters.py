"""Running-average meters (TGL101): ``AverageMeter.update(val, n)``.

The meter idiom of pytorch/examples' ImageNet script, copied into countless
training scripts and libraries, adds every value it is given into a running
sum (``self.sum += val * n``). Given a loss tensor instead of
``loss.item()``, that sum holds the autograd graph of every step since the
meter was reset. Decided on Python's ``ast`` so that the project index's
outline (:mod:`torchgradlint.project_index`) and a class of the linted file
are judged by the same test; importing this module imports neither LibCST
nor torch.
"""

from __future__ import annotations

import ast
import re

METER_UPDATE = "update"
"""The method through which a meter takes a value (its first argument after ``self``)."""

METER_CLASS_NAME = re.compile(r"(Average|Avg|Mean|Running)\w*Meter$")
"""Names of the idiom's classes (``AverageMeter``, ``AvgMeter``, ``RunningAverageMeter``): how a
class from outside the project (``timm.utils.AverageMeter``), which the linter cannot read, is judged."""

# Calls and attributes that turn a tensor into a plain number or a detached tensor.
_CONVERTING = frozenset({"float", "int", "item", "detach", "tolist", "numpy", "data", "cpu"})


def update_accumulates(cls: ast.ClassDef) -> bool:
    """Whether the class's ``update`` method adds its first argument (after
    ``self``) into an attribute of ``self`` as given: ``self.sum += val *
    n`` does, ``self.sum += float(val) * n`` and ``self.val = val`` (which
    keeps only the latest value) do not."""
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name != METER_UPDATE \
                or len(fn.args.args) < 2:
            continue
        param = fn.args.args[1].arg
        for node in ast.walk(fn):
            if isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) \
                    and isinstance(node.target, ast.Attribute) and isinstance(node.target.value, ast.Name) \
                    and node.target.value.id == "self" and _reads_as_given(node.value, param):
                return True
    return False


def _reads_as_given(expr: ast.expr, param: str) -> bool:
    """Whether ``expr`` reads ``param`` and converts nothing (no ``float(...)``,
    ``.item()``, ``.detach()``, ``.data``...)."""
    reads = False
    for node in ast.walk(expr):
        if isinstance(node, ast.Name) and node.id in _CONVERTING or \
                isinstance(node, ast.Attribute) and node.attr in _CONVERTING:
            return False
        reads = reads or isinstance(node, ast.Name) and node.id == param
    return reads
