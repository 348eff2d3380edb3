"""A fast read-only walk over LibCST trees.

``libcst.CSTNode.visit`` rebuilds every node it passes (whitespace included)
even for read-only visitors, and ``CSTNode.children`` does the same; on real
files that made the analysis traversal cost about 1.8x the parse itself.
This walk reads the dataclass fields directly, skips whitespace and token
fields (they hold no calls, bindings or scopes), and yields children in
source order.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import libcst as cst

_SKIP = frozenset({
    "leading_lines", "lines_after_decorators", "lpar", "rpar", "comma", "semicolon", "equal", "dot",
    "colon", "lbracket", "rbracket", "lbrace", "rbrace", "operator", "asynchronous", "header", "footer",
    "indent", "newline", "trailing_whitespace", "empty_lines", "posonly_ind", "attr", "keyword", "star",
    "default_indent", "default_newline", "encoding", "has_trailing_newline", "whitespace",
})

# Fields whose dataclass order differs from source order.
_SOURCE_ORDER: dict[type, tuple[str, ...]] = {
    cst.FunctionDef: ("decorators", "name", "params", "returns", "body"),
    cst.ClassDef: ("decorators", "name", "bases", "keywords", "body"),
    cst.IfExp: ("body", "test", "orelse"),
    cst.Parameters: ("posonly_params", "params", "star_arg", "kwonly_params", "star_kwarg"),
}

_FIELDS: dict[type, tuple[str, ...]] = {}
# Field types that never hold a node (``Name.value``, ``Integer.value``): leaves have no child fields.
_SCALARS = (str, bool, int)


def node_types(*bases: type) -> frozenset[type]:
    """Every class that derives from one of ``bases`` (the bases included),
    for ``type(node) in node_types(...)`` tests.

    LibCST's node classes derive from :class:`abc.ABC`, so ``isinstance``
    against them runs ``ABCMeta.__instancecheck__``, a Python-level call, on
    every test; over a real-code corpus that was about 19 million calls per
    lint, a tenth of its time. LibCST defines all its node classes when it is
    imported and its parser builds only those, so a set of them, computed
    once, answers the same question with a hash lookup.
    """
    found: set[type] = set()
    todo = list(bases)
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return frozenset(found)


NODE_TYPES = node_types(cst.CSTNode)


def child_fields(tp: type) -> tuple[str, ...]:
    """Names of the fields of node type ``tp`` that may hold child nodes, in
    source order."""
    fields = _FIELDS.get(tp)
    if fields is None:
        if tp in _SOURCE_ORDER:
            fields = _SOURCE_ORDER[tp]
        else:
            fields = tuple(
                f.name for f in dataclasses.fields(tp)
                if f.name not in _SKIP and not f.name.startswith("whitespace") and f.type not in _SCALARS
            )
        _FIELDS[tp] = fields
    return fields


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The child nodes of ``node`` that can hold code, in source order (a
    list: cheaper than a generator for the walks, which take them all)."""
    kind = type(node)
    fields = _FIELDS.get(kind)
    if fields is None:
        fields = child_fields(kind)
    out: list[cst.CSTNode] = []
    for name in fields:
        value = getattr(node, name)
        vkind = type(value)
        if vkind in NODE_TYPES:
            out.append(value)
        elif vkind is tuple or vkind is list:
            out.extend(item for item in value if type(item) in NODE_TYPES)
    return out


def iter_children(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """The child nodes of ``node`` that can hold code, in source order."""
    return iter(children(node))


def walk(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """Pre-order walk of ``node``'s subtree (``node`` first)."""
    stack = [node]
    while stack:
        n = stack.pop()
        yield n
        kids = children(n)
        if kids:
            kids.reverse()
            stack.extend(kids)
