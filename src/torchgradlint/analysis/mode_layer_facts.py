"""Mode layers of modules built by same-file factories.

:func:`.modes.mode_sensitive` judges a module by its constructor bindings and
counts a module that comes out of a helper (``benchmark, model =
make_parts()``) as sensitive, unseen. These two facts look one step further:

- :func:`factory_class`: the same-file module class a name holds when every
  binding of it in a scope takes (an element of) what a same-file function
  returns, and every ``return`` of that function builds the same class there;
- :func:`class_has_mode_layers`: whether a same-file module class (with the
  same-file module classes it names) mentions a layer whose forward depends on
  ``training`` (dropout, batch norm, ...). A base class the file cannot see is
  a mixin when the class also derives from ``torch.nn.Module`` or another
  ``torch.nn`` class; alone, it may hold such layers and counts as one.

PyTorch docs: ``torch.nn.Module.train`` ("This has an effect only on certain
modules ... e.g. Dropout, BatchNorm").
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from .model import FileModel, Scope
from .modes import module_classes, spells_mode_layer
from .torch_api import MODE_LAYER

_MODE_TOKENS = re.compile(MODE_LAYER.pattern + r"|\bdropout\b|batch_norm|\.training\b")
# strings and comments: "a model without Dropout" in a docstring is no layer
_NOT_CODE = re.compile(r'""".*?"""|\'\'\'.*?\'\'\'|"[^"\n]*"|\'[^\'\n]*\'|#[^\n]*', re.S)
_WORD = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")


def factory_class(model: FileModel, scope: Scope, text: str) -> Optional[str]:
    """The same-file module class that ``text`` holds in ``scope`` when each
    of its bindings there takes the result of a same-file function whose
    every ``return`` constructs that class at the same position (several
    same-file functions of that name: all of them), else ``None``."""
    found: set[str] = set()
    for a in model.bindings_of(text, scope):
        if a.kind not in ("assign", "annassign") or not isinstance(a.value, cst.Call):
            return None
        index = next((i for i, t in enumerate(a.targets) if t.text == text), None)
        fns = [s for s in model.functions.get(_callee_name(a.value) or "", []) if s.class_name is None]
        if index is None or not fns:
            return None
        returns = [r.value for fn in fns for r in model.returns_of(fn)]
        if not returns:
            return None
        for value in returns:
            if a.unpacked:
                if not isinstance(value, cst.Tuple) or index >= len(value.elements):
                    return None
                value = value.elements[index].value
            name = _constructed(value)
            if name is None or name not in module_classes(model):
                return None
            found.add(name)
    return found.pop() if len(found) == 1 else None


def class_has_mode_layers(model: FileModel, name: str, _seen: Optional[set[str]] = None) -> bool:
    """Whether the same-file module class ``name`` may hold a layer whose
    forward depends on ``training`` (see the module docstring)."""
    seen = _seen if _seen is not None else set()
    if name in seen:
        return False
    seen.add(name)
    info = model.classes.get(name)
    if info is None:
        return True
    local = module_classes(model)
    torch_base = any(b.startswith("torch.nn.") or b.split(".")[-1] in local for b in info.bases)
    if any(b.split(".")[-1] not in local and not b.startswith("torch.nn.") for b in info.bases) and not torch_base:
        return True
    code = _NOT_CODE.sub("", model.module.code_for_node(info.node))
    if spells_mode_layer(model, code, _MODE_TOKENS):
        return True
    for base in info.bases:
        last = base.split(".")[-1]
        if last in local and class_has_mode_layers(model, last, seen):
            return True
    return any(word in local and class_has_mode_layers(model, word, seen)
               for word in set(_WORD.findall(code)) - {name})


def _callee_name(call: cst.Call) -> Optional[str]:
    return call.func.value if isinstance(call.func, cst.Name) else None


def _constructed(value: Optional[cst.BaseExpression]) -> Optional[str]:
    """``C`` for ``C(...)`` (through ``.to(...)``-style calls)."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        value = value.func.value
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
        return value.func.value
    return None
