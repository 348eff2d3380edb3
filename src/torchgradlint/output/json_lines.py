"""One JSON object per line (JSON Lines), each shaped like an element of the
``json`` format's array."""

from __future__ import annotations

import json
from typing import Sequence

from ..diagnostics import Diagnostic
from .json_format import to_dict


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """Each diagnostic as a compact JSON object on its own line."""
    return "".join(json.dumps(to_dict(d)) + "\n" for d in diagnostics)
