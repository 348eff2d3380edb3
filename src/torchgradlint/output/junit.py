"""JUnit XML (built with :mod:`xml.etree`): a ``testsuite`` per checked file,
a ``testcase`` with a ``failure`` per diagnostic, and one passing
``testcase`` for a clean file. CI systems show findings as failed tests."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Sequence

from ..diagnostics import Diagnostic
from ._common import rule_name
from .concise import format_line, location


def to_element(diagnostics: Sequence[Diagnostic], ctx) -> ET.Element:
    """The ``<testsuites>`` element."""
    by_path: dict[str, list[Diagnostic]] = {}
    for p in ctx.paths:
        by_path.setdefault(p, [])
    for d in diagnostics:
        by_path.setdefault(d.path, []).append(d)
    root = ET.Element("testsuites", name="torchgradlint", tests="0", failures=str(len(diagnostics)))
    total = 0
    for path in sorted(by_path):
        found = by_path[path]
        suite = ET.SubElement(root, "testsuite", name=path, tests=str(max(1, len(found))),
                              failures=str(len(found)), errors="0", skipped="0")
        if not found:
            ET.SubElement(suite, "testcase", name="torchgradlint", classname=path, file=path)
        for d in found:
            name = rule_name(d.code)
            case = ET.SubElement(suite, "testcase", classname=path, file=path,
                                 name=f"{d.code} ({name}) at {location(d)[len(d.path) + 1:]}" if name
                                 else f"{d.code} at {location(d)[len(d.path) + 1:]}",
                                 line=str(d.line))
            failure = ET.SubElement(case, "failure", message=d.message, type=d.code)
            failure.text = format_line(d) + (f"\n{d.detail}" if d.detail else "")
        total += max(1, len(found))
    root.set("tests", str(total))
    return root


def render(diagnostics: Sequence[Diagnostic], ctx) -> str:
    """The JUnit XML document."""
    root = to_element(diagnostics, ctx)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
