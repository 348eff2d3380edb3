"""A JSON array in ruff's shape: code, message (one short line), filename,
location{row,column}, end_location, url, fix (``null``, or applicability
``safe``/``unsafe``, message and edits), noqa_row, cell (the 1-based code cell
of a notebook diagnostic, whose rows are then lines within that cell; ``null``
otherwise); plus name (the rule's kebab name) and detail (why, and the fix;
``null`` when the rule gives none)."""

from __future__ import annotations

import json
from typing import Sequence

from ..diagnostics import Diagnostic
from ._common import fix_message, rule_name


def to_dict(d: Diagnostic) -> dict:
    """One diagnostic as ruff's JSON object (1-based rows and columns)."""
    from ..registry import DOCS_URL

    fix = None
    if d.fix is not None:
        fix = {
            "applicability": "safe" if d.fix.safe else "unsafe",
            "message": fix_message(d),
            "edits": [{
                "content": d.fix.replacement,
                "location": {"row": d.fix.start[0], "column": d.fix.start[1]},
                "end_location": {"row": d.fix.end[0], "column": d.fix.end[1]},
            }],
        }
    return {
        "code": d.code,
        "name": rule_name(d.code),
        "message": d.message,
        "detail": d.detail,
        "filename": d.path,
        "location": {"row": d.line, "column": d.col},
        "end_location": {"row": d.end_line, "column": d.end_col},
        "url": DOCS_URL.format(code=d.code) if d.code != "TGL000" else None,
        "fix": fix,
        "noqa_row": d.line,
        "cell": d.cell,
    }


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """The diagnostics as one indented JSON array."""
    return json.dumps([to_dict(d) for d in diagnostics], indent=2) + "\n"
