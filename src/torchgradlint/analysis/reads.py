"""Where a variable is read: whether the value an assignment binds is ever used.

The analysis records bindings (:class:`~torchgradlint.analysis.model.Assign`)
and calls, not reads. A rule that must know whether a result is used at all
(``out = model(x)`` under ``no_grad`` to initialise lazy modules, the output
thrown away) asks :func:`never_read`.

Reads follow Python's scoping: a name read in a function that binds the same
name itself (an assignment, a parameter, a ``for`` target...) is that
function's own variable; one read in a function that does not bind it reads
the enclosing scope's (a module-level variable read by a function). Every
``Name`` the file holds outside binding positions counts as a read,
comprehension variables included; ``del x`` and ``x += 1`` count as reads.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .model import FileModel, Scope
from .tree import iter_children, walk

# Fields of these nodes that bind the names of the ``Name`` (or tuple of names) they hold.
_BINDING_FIELDS: dict[type, tuple[str, ...]] = {
    cst.AssignTarget: ("target",),
    cst.AnnAssign: ("target",),
    cst.For: ("target",),
    cst.CompFor: ("target",),
    cst.NamedExpr: ("target",),
    cst.AsName: ("name",),
    cst.Param: ("name",),
    cst.FunctionDef: ("name",),
    cst.ClassDef: ("name",),
    cst.ImportAlias: ("name",),
}
_SCOPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef)


def _targets(node: Optional[cst.CSTNode]) -> list[cst.Name]:
    """The ``Name`` nodes a binding target binds (``a, (b, *c) = ...``: a, b, c)."""
    if isinstance(node, cst.Name):
        return [node]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [n for e in node.elements for n in _targets(e.value)]
    if isinstance(node, cst.StarredElement):
        return _targets(node.value)
    return []


def _reads(model: FileModel) -> dict[str, list[cst.CSTNode]]:
    """name -> the scope node (module, function, lambda or class) of each read of it."""
    def build() -> dict[str, list[cst.CSTNode]]:
        bound: set[int] = set()
        for node in walk(model.module):
            for name in _BINDING_FIELDS.get(type(node), ()):
                bound.update(id(n) for n in _targets(getattr(node, name)))
        out: dict[str, list[cst.CSTNode]] = {}
        stack: list[tuple[cst.CSTNode, cst.CSTNode]] = [(model.module, model.module)]
        while stack:
            node, scope = stack.pop()
            if isinstance(node, cst.Name):
                if id(node) not in bound:
                    out.setdefault(node.value, []).append(scope)
                continue
            inner = node if isinstance(node, _SCOPES) and node is not scope else scope
            stack.extend((child, inner) for child in iter_children(node))
        return out
    return model.cached("name-reads", build)


def never_read(model: FileModel, names: list[str], scope: Scope) -> bool:
    """Whether no variable of ``names`` bound in ``scope`` is read anywhere:
    neither in ``scope`` itself nor in a function, lambda or class nested in
    it (at any depth) that does not bind the name itself. Conservative: any
    read counts, before or after the binding, and an unknown scope counts
    as a read."""
    scopes = {id(s.node): s for s in model.scopes}
    for name in names:
        for node in _reads(model).get(name, ()):
            s: Optional[Scope] = scopes.get(id(node))
            if s is None:
                return False
            while s is not None and s is not scope:
                if s.kind != "class" and model.bindings_of(name, s) or name in s.params:
                    break  # the inner scope's own variable
                s = s.parent
            if s is scope:
                return False
    return True


def assigned_names(stmt: cst.CSTNode, value: cst.CSTNode) -> Optional[list[str]]:
    """The names ``stmt`` binds when it is ``x = value`` / ``a, b = value``
    (every target a name or a tuple of names), else ``None``."""
    if not isinstance(stmt, cst.Assign) or stmt.value is not value:
        return None
    names: list[str] = []
    for t in stmt.targets:
        found = _targets(t.target)
        if not found or len(found) != _count(t.target):
            return None
        names += [n.value for n in found]
    return names


def _count(node: cst.CSTNode) -> int:
    """How many binding positions a target has (a subscript or attribute counts, and is no name)."""
    if isinstance(node, (cst.Tuple, cst.List)):
        return sum(_count(e.value) for e in node.elements)
    if isinstance(node, cst.StarredElement):
        return _count(node.value)
    return 1


def binding_never_read(model: FileModel, statement: cst.CSTNode, name: str, scope: Scope) -> bool:
    """Whether the value the simple statement ``statement`` binds to ``name``
    is never read: every read of ``name`` in ``scope`` lies in a simple
    statement of the scope (not a compound statement's header, not a nested
    function) where no binding made by ``statement`` reaches (``output =
    model(x)`` in a statistics pass, and an evaluation loop after it that
    binds ``output`` again before reading it). Conservative: a read that
    cannot be placed counts as a read of this binding."""
    reads = sum(1 for s in _reads(model).get(name, ()) if s is scope.node)
    if reads == 0:
        return never_read(model, [name], scope)
    mine = [a for a in model.assigns_in_scope(scope) if a.statement is statement and a.binds(name)]
    if len(mine) != 1:
        return False
    facts: dict[int, list] = {}
    for f in [*model.calls_in_scope(scope), *model.assigns_in_scope(scope)]:
        if isinstance(f.statement, cst.BaseSmallStatement):
            facts.setdefault(id(f.statement), [f.statement]).append(f)
    placed = 0
    for group in facts.values():
        stmt, located = group[0], group[1:]
        n = _reads_in(stmt, name)
        if not n:
            continue
        placed += n
        if any(mine[0] in model.reaching_bindings(name, f) for f in located):
            return False
    return placed == reads


def _reads_in(stmt: cst.CSTNode, name: str) -> int:
    """Reads of ``name`` inside the simple statement ``stmt`` (binding targets excluded)."""
    bound: set[int] = set()
    for node in walk(stmt):
        for field in _BINDING_FIELDS.get(type(node), ()):
            bound.update(id(n) for n in _targets(getattr(node, field)))
    return sum(1 for n in walk(stmt) if isinstance(n, cst.Name) and n.value == name and id(n) not in bound)
