"""What a context manager or decorator does to autograd's grad mode.

PyTorch docs: "Locally disabling gradient computation"
(https://pytorch.org/docs/stable/notes/autograd.html#locally-disabling-gradient-computation),
``torch.no_grad``, ``torch.enable_grad``, ``torch.set_grad_enabled``,
``torch.inference_mode``.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .model import GradMode

GRAD_MODE_APIS = frozenset(
    {"torch.no_grad", "torch.enable_grad", "torch.set_grad_enabled", "torch.inference_mode"}
)


def _literal_bool(node: Optional[cst.BaseExpression]) -> Optional[bool]:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


def classify(qualname: Optional[str], call: Optional[cst.Call]) -> Optional[GradMode]:
    """The grad mode a ``with`` item or decorator sets, or ``None`` if it is
    not a grad-mode API.

    ``call`` is the call node when the API is called (``torch.no_grad()``),
    ``None`` when it is used bare (``@torch.no_grad``). A non-literal flag
    (``set_grad_enabled(train)``) gives ``UNKNOWN``: never a finding.
    ``inference_mode(False)`` changes nothing and gives ``None``.
    """
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
        flag = _literal_bool(first)
        if flag is None:
            return GradMode.UNKNOWN
        return GradMode.DISABLED if flag else None
    # torch.set_grad_enabled
    if call is None or first is None:
        return None
    flag = _literal_bool(first)
    if flag is None:
        return GradMode.UNKNOWN
    return GradMode.ENABLED if flag else GradMode.DISABLED
