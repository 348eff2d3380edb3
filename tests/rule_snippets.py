"""Lint a snippet with one rule and return its finding lines (shared by the tests of rules)."""

import textwrap

from torchgradlint.engine import lint_source


def finding_lines(rule: type, src: str) -> list[int]:
    """1-based lines of ``rule``'s findings in the dedented ``src``."""
    result = lint_source(textwrap.dedent(src), "x.py", [rule])
    return [d.line for d in result.diagnostics if d.code == rule.code]


# The annotated Transformer's loss helper (harvardnlp; copied by many tutorials): it backpropagates,
# steps the optimizer it holds, and returns the loss; ``{reset}`` follows the step, ``{returned}``
# is what it returns.
SIMPLE_LOSS_COMPUTE = """
class SimpleLossCompute:
    def __init__(self, generator, criterion, opt=None):
        self.generator = generator
        self.criterion = criterion
        self.opt = opt

    def __call__(self, x, y, norm):
        loss = self.criterion(self.generator(x), y) / norm
        loss.backward()
        if self.opt is not None:
            self.opt.step()
            {reset}
        return {returned}
"""
