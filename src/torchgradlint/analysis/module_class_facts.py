"""Facts about ``torch.nn.Module`` subclasses defined in a file: which classes
they are, which method a node sits in, and which methods ``forward`` reaches.

PyTorch docs: ``torch.nn.Module`` ("Base class for all neural network
modules ... Submodules assigned in this way will be registered"),
``torch.nn.Module.training``, ``torch.nn.Module.forward``.

Used by TGL203 (functional dropout in a module method), TGL006 (unregistered
submodules) and TGL007 (layers built in ``forward``).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .model import ClassInfo, FileModel, Scope
from .modes import module_classes

# Frameworks with an ``nn`` namespace of their own: a class deriving from one of
# these is not a torch module, whatever ``nn.Module`` spells.
FOREIGN_NN = ("mlx.", "flax.", "haiku.", "jax.", "equinox.", "tensorflow.", "keras.", "tf.", "paddle.",
              "mindspore.", "oneflow.", "mxnet.", "trax.", "objax.", "jittor.", "tinygrad.")

_STATIC = frozenset({"staticmethod", "classmethod"})


def _foreign(base: str) -> bool:
    return base.startswith(FOREIGN_NN) or base.split(".")[0] in {f.rstrip(".") for f in FOREIGN_NN}


def is_torch_module_class(model: FileModel, name: str, *, lenient: bool = False) -> bool:
    """Whether the same-file class ``name`` is a ``torch.nn.Module`` subclass.

    Strict: it derives (transitively, through same-file classes) from
    ``torch.nn.Module``, another ``torch.nn`` class or a Lightning module
    (:func:`.modes.module_classes`). ``lenient`` also accepts a class that
    defines ``forward`` and derives from a base the file cannot see (imported
    from elsewhere), unless a base belongs to another framework (MLX, Flax,
    Haiku, Keras, ...): what a rule that already matched a torch API inside
    the class (``torch.nn.functional.dropout``) may assume.
    """
    if name in module_classes(model):
        return True
    info = model.classes.get(name)
    if not lenient or info is None or "forward" not in info.methods:
        return False
    if not info.bases or any(_foreign(b) for b in info.bases):
        return False
    return all(b != "object" for b in info.bases)


def enclosing_method(model: FileModel, scope: Scope) -> Optional[tuple[ClassInfo, Scope]]:
    """The class and method a scope belongs to: ``scope`` itself when it is a
    method, or the method a nested function or lambda is defined in."""
    s: Optional[Scope] = scope
    while s is not None:
        if s.kind == "function" and s.class_name is not None:
            info = model.classes.get(s.class_name)
            if info is None or info.methods.get(s.name) is not s:
                return None
            return info, s
        if s.kind == "class":
            return None
        s = s.parent
    return None


def self_name(method: Scope) -> Optional[str]:
    """The name of an instance method's first parameter (``self``), or ``None``
    for a static or class method or one without parameters."""
    fn = method.node
    if isinstance(fn, cst.FunctionDef):
        for dec in fn.decorators:
            d = dec.decorator
            if isinstance(d, cst.Name) and d.value in _STATIC:
                return None
        params = [*fn.params.posonly_params, *fn.params.params]
        if params:
            return params[0].name.value
    return None


def forward_methods(model: FileModel, info: ClassInfo) -> list[Scope]:
    """``forward`` of class ``info`` and every same-class method it calls as
    ``self.m(...)``, transitively (helpers such as ``_project`` that only run
    inside ``forward``). Empty when the class defines no ``forward``."""
    start = info.methods.get("forward")
    if start is None:
        return []
    seen: dict[int, Scope] = {id(start): start}
    todo = [start]
    while todo:
        scope = todo.pop()
        for c in model.calls_within(scope.order, scope.end):
            name = self_name(scope)
            if not name or not c.func_text or not c.func_text.startswith(name + "."):
                continue
            target = info.methods.get(c.func_text[len(name) + 1:])
            if target is not None and id(target) not in seen:
                seen[id(target)] = target
                todo.append(target)
    return list(seen.values())
