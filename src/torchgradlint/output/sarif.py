"""SARIF 2.1.0 for GitHub code scanning and other SARIF viewers.

One run; ``tool.driver.rules`` lists every rule (plus ``TGL000``
parse-error) with id, name, shortDescription, fullDescription, help (text and
Markdown: the rule's docs), helpUri and defaultConfiguration.level. Each result
has ruleId, ruleIndex, level, message.text and one physical location whose
``artifactLocation.uri`` is relative to ``%SRCROOT%`` (the repository root,
forward slashes) and whose region is 1-based with an exclusive end column,
counted in Unicode code points (``columnKind``). ``message.text`` is the
short message; ``properties.detail`` the longer detail (why, and the fix), and
``fixes`` the autofix as a replacement of the reported file's region. A
notebook result's region is the cell line inside the ``.ipynb`` JSON; its
message names the cell.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

from .. import __version__
from ..diagnostics import PARSE_ERROR_CODE, PARSE_ERROR_DOCS, PARSE_ERROR_NAME, Diagnostic
from ._common import file_region, fix_message, repo_root

SCHEMA_URI = "https://json.schemastore.org/sarif-2.1.0.json"
INFORMATION_URI = "https://github.com/torchgradlint/torchgradlint"


def level_for(code: str) -> str:
    """SARIF level: gradient correctness (TGL0xx) and parse errors are
    ``error``, opinionated advice (TGL9xx) ``note``, the rest ``warning``."""
    if code.startswith("TGL0"):
        return "error"
    if code.startswith("TGL9"):
        return "note"
    return "warning"


def rule_descriptors() -> list[dict[str, Any]]:
    """``reportingDescriptor`` objects: ``TGL000`` then every rule by code."""
    from ..registry import DOCS_URL, all_rules

    out = [{
        "id": PARSE_ERROR_CODE,
        "name": PARSE_ERROR_NAME,
        "shortDescription": {"text": "file could not be read or parsed"},
        "fullDescription": {"text": "A file that could not be read, decoded or parsed is not linted."},
        "help": {"text": PARSE_ERROR_DOCS, "markdown": PARSE_ERROR_DOCS},
        "helpUri": INFORMATION_URI,
        "defaultConfiguration": {"level": "error"},
        "properties": {"tags": ["torchgradlint"]},
    }]
    for r in all_rules():
        docs = r.docs.strip() or r.summary
        out.append({
            "id": r.code,
            "name": r.name,
            "shortDescription": {"text": r.summary or r.name},
            "fullDescription": {"text": " ".join(r.section("What it does").split()) or r.summary or r.name},
            "help": {"text": docs, "markdown": docs},
            "helpUri": DOCS_URL.format(code=r.code),
            "defaultConfiguration": {"level": level_for(r.code), "enabled": bool(r.default_enabled)},
            "properties": {"tags": ["torchgradlint", "pytorch", "autograd"]},
        })
    return out


def _uri(path: str, root: Path) -> tuple[str, bool]:
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(root).as_posix(), True
    except ValueError:
        return absolute.as_uri(), False


def to_sarif(diagnostics: Sequence[Diagnostic], ctx) -> dict[str, Any]:
    """The SARIF log as a JSON-ready dict."""
    root = Path(os.path.abspath(ctx.root)) if ctx.root else repo_root()
    rules = rule_descriptors()
    index = {r["id"]: i for i, r in enumerate(rules)}
    cache: dict = {}
    results = []
    for d in diagnostics:
        uri, relative = _uri(d.path, root)
        artifact: dict[str, Any] = {"uri": uri}
        if relative:
            artifact["uriBaseId"] = "%SRCROOT%"
        physical: dict[str, Any] = {"artifactLocation": artifact}
        region = file_region(d, ctx, cache)
        if region is None:  # notebook line not located in the JSON: the file's first line
            region = (1, 1, 1, 1)
        line, col, end_line, end_col = region
        physical["region"] = {"startLine": line, "startColumn": col, "endLine": end_line, "endColumn": end_col}
        text = d.message if d.cell is None else f"{d.message} (cell {d.cell}, line {d.line}, column {d.col})"
        result: dict[str, Any] = {
            "ruleId": d.code,
            "level": level_for(d.code),
            "message": {"text": text},
            "locations": [{"physicalLocation": physical}],
        }
        if d.code in index:
            result["ruleIndex"] = index[d.code]
        properties: dict[str, Any] = {}
        if d.detail:
            properties["detail"] = d.detail
        if d.cell is not None:
            properties.update({"cell": d.cell, "cellLine": d.line, "cellColumn": d.col})
        if properties:
            result["properties"] = properties
        if d.fix is not None and d.cell is None:
            (l1, c1), (l2, c2) = d.fix.start, d.fix.end
            result["fixes"] = [{
                "description": {"text": fix_message(d) + ("" if d.fix.safe else " (unsafe)")},
                "artifactChanges": [{"artifactLocation": dict(artifact), "replacements": [{
                    "deletedRegion": {"startLine": l1, "startColumn": c1, "endLine": l2, "endColumn": c2},
                    "insertedContent": {"text": d.fix.replacement},
                }]}],
            }]
        results.append(result)
    return {
        "$schema": SCHEMA_URI,
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "torchgradlint",
                "version": __version__,
                "semanticVersion": __version__,
                "informationUri": INFORMATION_URI,
                "rules": rules,
            }},
            "originalUriBaseIds": {"%SRCROOT%": {"uri": root.as_uri() + "/"}},
            "columnKind": "unicodeCodePoints",
            "results": results,
        }],
    }


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """The SARIF log as indented JSON."""
    return json.dumps(to_sarif(diagnostics, ctx), indent=2) + "\n"
