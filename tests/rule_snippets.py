"""Lint a snippet with one rule and return its finding lines (shared by the tests of rules)."""

import textwrap

from torchgradlint.engine import lint_source


def finding_lines(rule: type, src: str) -> list[int]:
    """1-based lines of ``rule``'s findings in the dedented ``src``."""
    result = lint_source(textwrap.dedent(src), "x.py", [rule])
    return [d.line for d in result.diagnostics if d.code == rule.code]
