"""Shared semantic facts that rules ask for, built in one traversal per file.

- :mod:`.names`: torch name resolution through import aliases;
- :mod:`.model`: the fact records (scopes, loops, calls, assignments, grad-mode
  regions) and queries over them;
- :mod:`.builder`: the single LibCST traversal that fills the model;
- :mod:`.steps`: what a backward, an optimizer step and a gradient reset are;
- :mod:`.provenance`: which expressions hold graph-attached tensors;
- :mod:`.modes`: which names are modules and where they enter eval/train mode.
"""

from .builder import build_model
from .model import FileModel, GradMode

__all__ = ["FileModel", "GradMode", "build_model"]
