"""Shared semantic facts that rules ask for, built in one traversal per file.

- :mod:`.names`: torch name resolution through import aliases;
- :mod:`.model`: the fact records (scopes, loops, calls, assignments, grad-mode
  regions) and queries over them;
- :mod:`.builder`: the single LibCST traversal that fills the model;
- :mod:`.steps`: what a backward, an optimizer step and a gradient reset are;
- :mod:`.provenance`: which expressions hold graph-attached tensors;
- :mod:`.modes`: which names are modules and where they enter eval/train mode.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .builder import build_model
    from .model import FileModel, GradMode


def __getattr__(name: str) -> Any:
    """``build_model``, ``FileModel`` and ``GradMode``, imported on first use
    (PEP 562), so that a light submodule (:mod:`.torch_api`, the vocabulary
    the prefilter shares with the rules) imports without LibCST."""
    if name == "build_model":
        from .builder import build_model

        return build_model
    if name in ("FileModel", "GradMode"):
        from . import model

        return getattr(model, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FileModel", "GradMode", "build_model"]
