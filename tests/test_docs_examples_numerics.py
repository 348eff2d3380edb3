"""The docs of the numerics rules: the "Example" block fires the rule, "Use instead" is silent."""

import re

import pytest

from torchgradlint.engine import lint_source
from torchgradlint.registry import get_rule

CODES = ["TGL104", "TGL303", "TGL304", "TGL305"]


def block(docs: str, heading: str) -> str:
    """The first ```python block under ``## heading``."""
    section = docs.split(f"## {heading}\n", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, f"no python block under {heading}"
    return match.group(1)


@pytest.mark.parametrize("code", CODES)
def test_example_fires_and_use_instead_is_silent(code):
    rule = get_rule(code)
    bad = lint_source(block(rule.docs, "Example"), "example.py", [rule]).diagnostics
    good = lint_source(block(rule.docs, "Use instead"), "use_instead.py", [rule]).diagnostics
    assert [d.code for d in bad] and {d.code for d in bad} == {code}
    assert [d.code for d in good] == []
