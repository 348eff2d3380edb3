"""Literal values: what a constant expression, or a name bound only to one, evaluates to.

One evaluator for every rule that asks "is this argument ``False``?", "is
this clip threshold infinite?", "is this ``eps`` below float16's smallest
normal?", "do these two ``torch.save``/``torch.load`` calls name the same
path?" or "which branch of ``__init__`` does ``resample='down'`` take?".

- :func:`literal_value` reads one expression: a string, a number (with a
  unary sign), ``True``/``False``/``None``; anything else is :data:`UNKNOWN`.
- :func:`bound_literals` also follows a name to its bindings: the values
  when every binding (every one in the file, or every one that reaches
  ``at``) is a plain assignment of a literal; :func:`bound_literal` is their
  one value when they agree (``EPS = 1e-8`` ... ``eps=EPS``).
- :func:`plain_bindings` is the test behind it, shared with the analyses
  that read what a name holds without asking for a literal (a list of layers
  unpacked into ``nn.Sequential``).
- Small predicates: :func:`is_literal`, :func:`literal_bool`,
  :func:`is_zero_literal`, :func:`falsy_literal`, :func:`number`,
  :func:`is_infinite`.

Nothing here raises on any expression: what cannot be read is
:data:`UNKNOWN` (or ``None``/``False`` for the predicates), and the rules
stay silent on it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import libcst as cst

from .names import dotted_name

if TYPE_CHECKING:  # the model imports this module
    from .model import Assign, FileModel, _Located


class _Unknown:
    """The type of :data:`UNKNOWN`: a value no literal has."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNKNOWN"


#: What :func:`literal_value` and :func:`bound_literal` give for an
#: expression they cannot read (compare with ``is``).
UNKNOWN = _Unknown()

_SINGLETONS = {"True": True, "False": False, "None": None}
#: names of positive infinity (``max_norm=math.inf``: a clip that never clips)
INFINITY = frozenset({"math.inf", "torch.inf", "numpy.inf", "np.inf"})


def literal_value(node: Optional[cst.BaseExpression]) -> object:
    """The Python value of a literal: a string (``str`` or ``bytes``; implicit
    concatenation included, f-strings not), an ``int``/``float``/``complex``
    literal with an optional unary ``-``/``+``, or ``True``/``False``/``None``
    (a bare name, which Python does not let code rebind). :data:`UNKNOWN`
    for anything else, ``node`` ``None`` included."""
    if node is None:
        return UNKNOWN
    if isinstance(node, cst.Name):
        return _SINGLETONS.get(node.value, UNKNOWN)
    if isinstance(node, (cst.SimpleString, cst.ConcatenatedString)):
        try:
            value = node.evaluated_value
        except (ValueError, SyntaxError):
            return UNKNOWN
        return UNKNOWN if value is None else value  # ``None``: a concatenation with an f-string
    if isinstance(node, (cst.Integer, cst.Float, cst.Imaginary)):
        try:
            return node.evaluated_value
        except (ValueError, SyntaxError):
            return UNKNOWN
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, (cst.Minus, cst.Plus)) \
            and isinstance(node.expression, (cst.Integer, cst.Float, cst.Imaginary)):
        inner = literal_value(node.expression)
        if inner is UNKNOWN:
            return UNKNOWN
        return -inner if isinstance(node.operator, cst.Minus) else inner
    return UNKNOWN


def plain_bindings(model: "FileModel", name: str, at: "Optional[_Located]" = None) -> "Optional[list[Assign]]":
    """The bindings of the variable ``name`` (every one in the file, or with
    ``at`` every one that reaches it), when there is at least one and each is
    a plain assignment of one value (``x = ...`` or ``x: T = ...``; not a
    parameter, a loop or ``with`` target, an unpacking, an augmented
    assignment or an import); ``None`` otherwise."""
    if name in model.names.aliases:  # also imported somewhere in the file
        return None
    if at is None:
        bindings = [a for a in model.assigns if a.binds(name)]
    else:
        bindings = model.reaching_bindings(name, at)
    if not bindings or any(b.kind not in ("assign", "annassign") or b.unpacked or b.value is None
                           for b in bindings):
        return None
    return bindings


def bound_literals(model: "FileModel", node: Optional[cst.BaseExpression],
                   at: "Optional[_Located]" = None) -> Optional[list]:
    """The literal values ``node`` may have: ``[value]`` for a literal, or for
    a name the literal each of its :func:`plain_bindings` assigns, in source
    order (``ACCUM = 1`` in one branch, ``ACCUM = 0`` in another: ``[1, 0]``);
    ``None`` when one of them is no literal. Without ``at`` every binding in
    the file counts, which suits module-level constants; with ``at``, only
    those that reach it."""
    value = literal_value(node)
    if value is not UNKNOWN:
        return [value]
    if not isinstance(node, cst.Name):
        return None
    bindings = plain_bindings(model, node.value, at)
    values = [literal_value(b.value) for b in bindings or ()]
    return None if not values or any(v is UNKNOWN for v in values) else values


def bound_literal(model: "FileModel", node: Optional[cst.BaseExpression], at: "Optional[_Located]" = None) -> object:
    """The one value of :func:`bound_literals` (``EPS = 1e-8`` ... ``eps=EPS``:
    ``1e-8``); :data:`UNKNOWN` when there is none or they differ."""
    values = bound_literals(model, node, at)
    if not values or any(type(v) is not type(values[0]) or v != values[0] for v in values[1:]):
        return UNKNOWN
    return values[0]


def is_literal(node: Optional[cst.CSTNode], value: object) -> bool:
    """Whether ``node`` is the literal ``True``, ``False`` or ``None`` that ``value`` is."""
    return (value is None or isinstance(value, bool)) and literal_value(node) is value


def literal_bool(node: Optional[cst.BaseExpression]) -> Optional[bool]:
    """``True``/``False`` for those literals; ``None`` for anything else."""
    value = literal_value(node)
    return value if isinstance(value, bool) else None


def number(node: Optional[cst.BaseExpression]) -> Optional[float]:
    """The value of a real number literal (``1e-8``, ``-1``) as a float;
    ``None`` for anything else (``True`` included)."""
    value = literal_value(node)
    return float(value) if type(value) in (int, float) else None


def is_zero_literal(node: Optional[cst.CSTNode]) -> bool:
    """Whether ``node`` is a number literal equal to zero (``0``, ``0.0``, ``0.``,
    ``0x0``): a dropout rate that drops nothing."""
    return isinstance(node, (cst.Integer, cst.Float)) and number(node) == 0.0


def falsy_literal(node: Optional[cst.BaseExpression]) -> bool:
    """``None``, ``False`` or ``0``: a value an ``if param:`` / ``if param is not None:`` gate skips."""
    return isinstance(node, cst.Name) and node.value in ("None", "False") or is_zero_literal(node)


def is_infinite(model: "FileModel", node: Optional[cst.BaseExpression]) -> bool:
    """Whether ``node`` is an infinity: ``float("inf")`` (any spelling
    ``float`` reads as one: ``"Infinity"``, ``"-inf"``), ``math.inf``,
    ``torch.inf``, ``numpy.inf`` (through the file's imports, or spelled
    ``np.inf``)."""
    if node is None:
        return False
    if isinstance(node, cst.Call) and dotted_name(node.func) == "float" and len(node.args) == 1:
        text = literal_value(node.args[0].value)
        if not isinstance(text, str):
            return False
        try:
            return math.isinf(float(text))
        except ValueError:
            return False
    text = dotted_name(node)
    return bool(text) and (text in INFINITY or (model.qualname(node) or "") in INFINITY)
