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

from .model import Assign, FileModel, Scope
from .torch_api import CONCAT_FUNCTIONS, DETACHING_METHODS
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
    statement of the scope or the header of a ``for``/``while``/``if`` (not
    a nested function) where no binding made by ``statement`` reaches (``output =
    model(x)`` in a statistics pass, and an evaluation loop after it that
    binds ``output`` again before reading it). Conservative: a read that
    cannot be placed counts as a read of this binding."""
    reads = sum(1 for s in _reads(model).get(name, ()) if s is scope.node)
    if reads == 0:
        return never_read(model, [name], scope)
    mine = [a for a in model.assigns_in_scope(scope) if a.statement is statement and a.binds(name)]
    if len(mine) != 1:
        return False
    placed = 0
    for stmt, located in _statement_groups(model, scope):
        n = _reads_in(stmt, name)
        if not n:
            continue
        placed += n
        if any(mine[0] in model.reaching_bindings(name, f) for f in located):
            return False
    return placed == reads


def _statement_groups(model: FileModel, scope: Scope) -> list[tuple[cst.CSTNode, list]]:
    """The places of ``scope`` where its reads can be told apart, each with
    the calls and bindings located there: every simple statement, and the
    header of a ``for`` (its iterable), ``while`` or ``if`` (its test), whose
    facts the model places at the compound statement. Memoised per scope:
    every store a rule asks about reads the same groups."""
    def build() -> list[tuple[cst.CSTNode, list]]:
        groups: dict[int, tuple[cst.CSTNode, list]] = {}
        for f in [*model.calls_in_scope(scope), *model.assigns_in_scope(scope)]:
            stmt = f.statement
            if isinstance(stmt, cst.BaseSmallStatement):
                node: cst.CSTNode = stmt
            elif isinstance(stmt, cst.For):
                node = stmt.iter
            elif isinstance(stmt, (cst.While, cst.If)):
                node = stmt.test
            else:
                continue
            groups.setdefault(id(stmt), (node, []))[1].append(f)
        return list(groups.values())
    return model.cached(("statement-groups", id(scope)), build)


def _reads_in(stmt: cst.CSTNode, name: str) -> int:
    """Reads of ``name`` inside the simple statement ``stmt`` (binding targets excluded)."""
    bound: set[int] = set()
    for node in walk(stmt):
        for field in _BINDING_FIELDS.get(type(node), ()):
            bound.update(id(n) for n in _targets(getattr(node, field)))
    return sum(1 for n in walk(stmt) if isinstance(n, cst.Name) and n.value == name and id(n) not in bound)


def _detaching_reads(model: FileModel, stmt: cst.CSTNode, name: str) -> int:
    """Reads of the list ``name`` in ``stmt`` whose every element is detached
    on the spot: ``torch.cat(name).detach()`` (any of
    :data:`~torchgradlint.analysis.torch_api.CONCAT_FUNCTIONS`, through
    ``.cpu()``/``.float()``..., ending in ``.detach()``/``.item()``/
    ``.tolist()``/``.numpy()`` or ``.data``) and ``[v.detach() for v in name]``."""
    count = 0
    for node in walk(stmt):
        if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                and node.func.attr.value in DETACHING_METHODS:
            inner: cst.BaseExpression = node.func.value
        elif isinstance(node, cst.Attribute) and node.attr.value == "data":
            inner = node.value
        elif isinstance(node, (cst.ListComp, cst.GeneratorExp)) and isinstance(node.for_in.iter, cst.Name) \
                and node.for_in.iter.value == name and node.for_in.inner_for_in is None and not node.for_in.ifs:
            elt = node.elt
            if isinstance(elt, cst.Call) and isinstance(elt.func, cst.Attribute) \
                    and elt.func.attr.value in DETACHING_METHODS and isinstance(elt.func.value, cst.Name) \
                    and elt.func.value.deep_equals(node.for_in.target):
                count += 1
            continue
        else:
            continue
        while isinstance(inner, cst.Call) and isinstance(inner.func, cst.Attribute) \
                and model.qualname(inner.func) not in CONCAT_FUNCTIONS:
            inner = inner.func.value  # ``.mean()``, ``.cpu()``, ``.view(-1)``... before the detaching call
        if isinstance(inner, cst.Call) and model.qualname(inner.func) in CONCAT_FUNCTIONS and inner.args \
                and isinstance(inner.args[0].value, cst.Name) and inner.args[0].value.value == name:
            count += 1
    return count


def read_only_detached(model: FileModel, binding: "Assign", name: str, stores: set[int]) -> bool:
    """Whether the list ``binding`` binds to ``name`` is read, besides the
    stores into it (the simple statements ``stores``, by ``id``) and
    ``len(name)``, only to detach every element (:func:`_detaching_reads`),
    at least once: PPO rollouts that append each step's ``value`` and
    ``log_prob`` with their graphs, then take ``torch.cat(values).detach()``
    after the loop. Reads reached by later bindings of ``name`` do not count;
    conservative: a read that cannot be placed in a simple statement or a
    ``for``/``while``/``if`` header of ``binding``'s scope (a ``with`` item,
    a nested function) is a read that keeps the graph."""
    found = _placed_reads(model, binding, name, binding.scope)
    if found is None:
        return False
    detached = 0
    for stmt, n in found:
        if id(stmt) in stores:
            continue
        lengths = sum(1 for node in walk(stmt) if isinstance(node, cst.Call) and isinstance(node.func, cst.Name)
                      and node.func.value == "len" and len(node.args) == 1
                      and isinstance(node.args[0].value, cst.Name) and node.args[0].value.value == name)
        d = _detaching_reads(model, stmt, name)
        if d + lengths < n:
            return False
        detached += d
    return detached > 0


def _placed_reads(model: FileModel, binding: "Assign", name: str,
                  scope: Scope) -> "Optional[list[tuple[cst.CSTNode, int]]]":
    """Each simple statement or ``for``/``while``/``if`` header of ``scope``
    that reads the value ``binding`` gives ``name``, with its number of reads
    of ``name`` (reads reached only by later bindings are left out); ``None``
    when a read of ``name`` in ``scope`` cannot be placed in one (a ``with``
    item, a nested function): the callers count it as a read of the value."""
    reads = sum(1 for s in _reads(model).get(name, ()) if s is scope.node)
    placed = 0
    out = []
    for stmt, located in _statement_groups(model, scope):
        n = _reads_in(stmt, name)
        if not n:
            continue
        placed += n
        if any(binding in model.reaching_bindings(name, f) for f in located):
            out.append((stmt, n))
    return out if placed == reads else None

#: what a shape probe reads of a module's output: ``out.shape``, ``out.size(1)``, ``out.dtype``...
SHAPE_ATTRIBUTES = frozenset({"shape", "size", "dtype", "ndim", "dim", "device", "numel"})


def read_only_for_shape(model: FileModel, statement: cst.CSTNode, name: str, scope: Scope) -> bool:
    """Whether the value the simple statement ``statement`` binds to ``name``
    is read only for its shape: every read of ``name`` in ``scope`` that this
    binding reaches is ``name.shape``, ``name.size(...)``, ``name.dtype``
    (:data:`SHAPE_ATTRIBUTES`), ``len(name)`` or ``type(name)`` (a model's
    shape check: ``out = model(x)``, then ``print(out.shape)``), and there is
    at least one. Conservative: a read that cannot be placed in a simple
    statement or a ``for``/``while``/``if`` header of the scope counts as a
    read of the values."""
    mine = [a for a in model.assigns_in_scope(scope) if a.statement is statement and a.binds(name)]
    found = _placed_reads(model, mine[0], name, scope) if len(mine) == 1 else None
    if not found:
        return False
    for stmt, n in found:
        shaped = 0
        for node in walk(stmt):
            if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == name \
                    and node.attr.value in SHAPE_ATTRIBUTES:
                shaped += 1
            elif isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value in ("len", "type") \
                    and len(node.args) == 1 and isinstance(node.args[0].value, cst.Name) \
                    and node.args[0].value.value == name:
                shaped += 1
        if shaped < n:
            return False
    return True
