"""What a context manager or decorator does to autograd's grad mode.

PyTorch docs: "Locally disabling gradient computation"
(https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation),
``torch.no_grad``, ``torch.enable_grad``, ``torch.set_grad_enabled``,
``torch.inference_mode``.
"""

from __future__ import annotations

from typing import Any, Optional

import libcst as cst

from .literals import literal_bool
from .model import GradMode

GRAD_MODE_APIS = frozenset(
    {"torch.no_grad", "torch.enable_grad", "torch.set_grad_enabled", "torch.inference_mode"}
)


#: Context managers of other libraries that set the mode of the modules they
#: are given, and grad mode with it, and restore the modules' modes on exit:
#: MONAI's ``eval_mode(*nets)`` (``eval()`` under ``torch.no_grad()``) and
#: ``train_mode(*nets)`` (``train()`` under ``torch.set_grad_enabled(True)``).
MODULE_MODE_MANAGERS = {
    f"monai.networks.{path}{name}_mode": name for path in ("", "utils.") for name in ("eval", "train")}


def classify(qualname: Optional[str], call: Optional[cst.Call]) -> Optional[GradMode]:
    """The grad mode a ``with`` item or decorator sets, or ``None`` if it is
    not a grad-mode API.

    ``call`` is the call node when the API is called (``torch.no_grad()``),
    ``None`` when it is used bare (``@torch.no_grad``). A non-literal flag
    (``set_grad_enabled(train)``) gives ``UNKNOWN``: never a finding.
    ``inference_mode(False)`` changes nothing and gives ``None``. MONAI's
    ``eval_mode(net)`` disables grad mode, its ``train_mode(net)`` enables it
    (:data:`MODULE_MODE_MANAGERS`).
    """
    if qualname in MODULE_MODE_MANAGERS and call is not None:
        return GradMode.DISABLED if MODULE_MODE_MANAGERS[qualname] == "eval" else GradMode.ENABLED
    if qualname not in GRAD_MODE_APIS:
        return None
    if qualname == "torch.no_grad":
        return GradMode.DISABLED
    if qualname == "torch.enable_grad":
        return GradMode.ENABLED
    first = None
    if call is not None:
        for a in call.args:
            if a.keyword is None or a.keyword.value in ("mode",):
                first = a.value
                break
    if qualname == "torch.inference_mode":
        if first is None:
            return GradMode.DISABLED
        flag = literal_bool(first)
        if flag is None:
            return GradMode.UNKNOWN
        return GradMode.DISABLED if flag else None
    # torch.set_grad_enabled
    if call is None or first is None:
        return None
    flag = literal_bool(first)
    if flag is None:
        return GradMode.UNKNOWN
    return GradMode.ENABLED if flag else GradMode.DISABLED


#: decorators that run the function as it is (or not at all): they cannot
#: change grad mode. Matched on the qualified name's first component, or the
#: whole name for builtins.
_TRANSPARENT_DECORATORS = frozenset({
    "staticmethod", "classmethod", "property", "functools", "abc", "typing", "typing_extensions", "contextlib",
    "dataclasses", "atexit", "pytest", "unittest", "parameterized", "hypothesis", "click", "typer", "fire",
    "hydra", "numba", "jax", "tf", "tensorflow", "wandb", "ray", "deprecated", "overload", "override", "cache",
    "lru_cache", "wraps", "cached_property", "abstractmethod", "contextmanager", "dataclass", "total_ordering",
    "singledispatch", "register", "jit", "script", "compile", "export", "app", "router", "task", "retry",
})


def other_decorator(name: str, same_file: bool, project: Optional[Any] = None) -> Optional[GradMode]:
    """The grad mode a decorator that is not a grad-mode API may impose on the
    function it decorates.

    ``name`` is its qualified (or dotted) name. A decorator named after a
    grad-mode API (``@smart_inference_mode()``, ``@torch_no_grad``) wraps
    the function in it: ``DISABLED``. A standard decorator that calls the
    function as it is (``functools.wraps``, ``staticmethod``, ``torch.jit``,
    ``pytest`` marks...) or one defined in the same file: ``None`` (no
    change). Any other decorator from elsewhere may run the function under
    any grad mode: ``UNKNOWN``, so nothing inside is judged as certainly
    grad-enabled through its callers.

    ``project``: the file's project index view; a decorator it resolves to a
    definition of the project gets that definition's effect (one that wraps
    ``torch.inference_mode``/``no_grad``: ``DISABLED``; one that just calls
    the function: ``None``), whatever its name.
    """
    if project is not None and name:
        found = project.decorator(name)
        if found is not None:
            return found.mode
    last = name.rsplit(".", 1)[-1].lower()
    if "inference_mode" in last or "no_grad" in last:
        return GradMode.DISABLED
    if not name or same_file:
        return None
    if name.startswith("torch."):
        return None  # torch's grad-mode APIs are classified above; the rest keep the mode
    if name.split(".", 1)[0] in _TRANSPARENT_DECORATORS or last in _TRANSPARENT_DECORATORS:
        return None
    return GradMode.UNKNOWN
