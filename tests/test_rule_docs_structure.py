"""The docs of TGL103, TGL203, TGL006 and TGL007: "Example" fires, "Use instead" is silent."""

import re

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.registry import get_rule

CODES = ["TGL006", "TGL007", "TGL103", "TGL203"]


def section_code(docs: str, heading: str) -> str:
    """The first ```python block under ``## heading``."""
    part = docs.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```python\n(.*?)```", part, re.S)
    assert m, f"no python block under {heading}"
    return m.group(1)


@pytest.mark.parametrize("code", CODES)
def test_example_fires_and_use_instead_is_silent(code):
    rule = get_rule(code)
    bad = lint_source(section_code(rule.docs, "Example"), "example.py", [rule])
    good = lint_source(section_code(rule.docs, "Use instead"), "use_instead.py", [rule])
    assert [d.code for d in bad.diagnostics] == [code]
    assert good.diagnostics == []
