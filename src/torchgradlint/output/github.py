"""GitHub Actions workflow commands: one ``::error`` annotation per diagnostic.

``::error file=PATH,line=L,col=C,endLine=EL,endColumn=EC,title=TGL001 (name)::message``

The message (data) escapes ``%``, ``\\r`` and ``\\n``; property values also
escape ``:`` and ``,`` (as in ``@actions/core``'s ``toCommandValue``). A
notebook diagnostic points at the cell line inside the ``.ipynb`` JSON where
that line is found, and its message starts with ``cell N, line L:``.
"""

from __future__ import annotations

from typing import Sequence

from ..diagnostics import Diagnostic
from ._common import file_region, rule_name


def escape_data(value: str) -> str:
    """Escape a workflow command's message."""
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(value: str) -> str:
    """Escape a workflow command's property value."""
    return escape_data(value).replace(":", "%3A").replace(",", "%2C")


def format_command(d: Diagnostic, region) -> str:
    """One diagnostic as an ``::error`` workflow command."""
    name = rule_name(d.code)
    props = [("file", d.path)]
    if region is not None:
        line, col, end_line, end_col = region
        props += [("line", str(line)), ("col", str(col)), ("endLine", str(end_line)),
                  ("endColumn", str(end_col))]
    props.append(("title", f"{d.code} ({name})" if name else d.code))
    message = d.message if d.cell is None else f"cell {d.cell}, line {d.line}: {d.message}"
    prop_text = ",".join(f"{k}={escape_property(v)}" for k, v in props)
    return f"::error {prop_text}::{escape_data(message)}"


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """All diagnostics as workflow commands, one per line."""
    cache: dict = {}
    return "".join(format_command(d, file_region(d, ctx, cache)) + "\n" for d in diagnostics)
