"""Torch name resolution: import aliases to qualified names, without LibCST's
QualifiedNameProvider (which costs several times a bare parse).

``import torch as T`` makes ``T.no_grad`` resolve to ``torch.no_grad``;
``from torch import no_grad`` makes ``no_grad`` resolve to ``torch.no_grad``;
``from torch.autograd import grad`` makes ``grad`` resolve to
``torch.autograd.grad``. Names that were never imported resolve to themselves,
so a script that uses ``torch`` without showing the import still resolves.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .torch_api import CANONICAL, CONVENTIONAL  # noqa: F401  (re-exported)


def dotted_name(node: Optional[cst.CSTNode]) -> Optional[str]:
    """``a.b.c`` for a chain of Name/Attribute nodes, else ``None``.

    >>> dotted_name(cst.parse_expression("self.model.encoder"))
    'self.model.encoder'
    """
    # ``type(node) is``: LibCST's node classes are ABCs, whose ``isinstance``
    # runs Python code; Name and Attribute have no subclasses.
    if type(node) is cst.Name:
        return node.value  # type: ignore[union-attr]
    parts: list[str] = []
    while type(node) is cst.Attribute:
        parts.append(node.attr.value)  # type: ignore[union-attr]
        node = node.value  # type: ignore[union-attr]
    if type(node) is cst.Name:
        parts.append(node.value)  # type: ignore[union-attr]
        return ".".join(reversed(parts))
    return None


def _module_dotted(node: cst.BaseExpression) -> Optional[str]:
    return dotted_name(node)


class ImportTable:
    """Maps local names bound by imports to fully qualified names.

    Imports anywhere in the file count (function-level imports too): shadowing
    an imported torch name with a local of the same name is rare enough that
    the cost of scope-exact resolution is not worth paying.
    """

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.imports_torch = False
        self.conventional: dict[str, str] = {}
        self.star_modules: list[str] = []  # ``from models import *``: where an unbound name may come from

    def assume_conventional(self, bound: set[str]) -> bool:
        """Resolve the :data:`CONVENTIONAL` names that the file never binds
        (``bound``: every name an import, assignment, parameter, ``def`` or
        ``class`` binds) to their torch modules. Returns whether any was
        added (qualified names computed before must then be recomputed).
        """
        added = {k: v for k, v in CONVENTIONAL.items() if k not in bound and k not in self.aliases}
        self.conventional = added
        return bool(added)

    def add(self, node: cst.CSTNode) -> None:
        """Record the bindings of an ``Import`` or ``ImportFrom`` statement."""
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _module_dotted(alias.name)
                if not full:
                    continue
                if full.split(".")[0] == "torch":
                    self.imports_torch = True
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.aliases[alias.asname.name.value] = full
                else:
                    head = full.split(".")[0]
                    self.aliases.setdefault(head, head)
        elif isinstance(node, cst.ImportFrom):
            if node.relative or node.module is None:
                return
            mod = _module_dotted(node.module)
            if not mod:
                return
            if mod.split(".")[0] == "torch":
                self.imports_torch = True
            if isinstance(node.names, cst.ImportStar):
                self.star_modules.append(mod)
                return
            for alias in node.names:
                name = dotted_name(alias.name)
                if not name:
                    continue
                local = name
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    local = alias.asname.name.value
                self.aliases[local] = f"{mod}.{name}"

    def qualify(self, dotted: Optional[str]) -> Optional[str]:
        """Resolve ``dotted`` through the aliases and canonicalise it.

        >>> t = ImportTable(); t.add(cst.parse_statement("import torch as T").body[0])
        >>> t.qualify("T.autograd.grad")
        'torch.autograd.grad'
        """
        if not dotted:
            return None
        head, sep, rest = dotted.partition(".")
        base = self.aliases.get(head) or self.conventional.get(head, head)
        full = f"{base}.{rest}" if sep else base
        return CANONICAL.get(full, full)

