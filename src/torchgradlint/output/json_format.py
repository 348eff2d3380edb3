"""A JSON array in ruff's shape: code, message, filename, location{row,column},
end_location, url, fix, noqa_row, cell (the 1-based code cell of a notebook
diagnostic, whose rows are then lines within that cell; ``null`` otherwise)."""

from __future__ import annotations

import json
from typing import Sequence

from ..diagnostics import Diagnostic


def to_dict(d: Diagnostic) -> dict:
    """One diagnostic as ruff's JSON object (1-based rows and columns)."""
    from ..registry import DOCS_URL

    fix = None
    if d.fix is not None:
        fix = {
            "applicability": "safe" if d.fix.safe else "unsafe",
            "message": "Apply the suggested change",
            "edits": [{
                "content": d.fix.replacement,
                "location": {"row": d.fix.start[0], "column": d.fix.start[1]},
                "end_location": {"row": d.fix.end[0], "column": d.fix.end[1]},
            }],
        }
    return {
        "code": d.code,
        "message": d.message,
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
