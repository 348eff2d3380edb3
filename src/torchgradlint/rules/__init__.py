"""One module per rule, named after the rule's kebab name (underscored).

Every module defines one :class:`~torchgradlint.registry.Rule` subclass;
:func:`~torchgradlint.registry.all_rules` discovers them.
"""

# Every shipped rule's code, in order (tests/test_engine.py checks it against
# the discovered rules). The flake8 plugin decides from it whether any TGL
# rule is selected without importing the rules, and so LibCST.
RULE_CODES = ("TGL001", "TGL002", "TGL101", "TGL102", "TGL201")

# Each rule's prefilter metadata (:attr:`Rule.prefilter`, :attr:`Rule.needs_backward`,
# :attr:`Rule.needs_grad_evidence`), so that the flake8 plugin can rule a file
# out without importing the rules and LibCST (about 0.4 s per flake8 process).
# tests/test_flake8.py checks it against the rule classes.
RULE_PREFILTER = {
    "TGL001": ((("backward",), ("step",)), True, False),
    "TGL002": ((("backward", "grad"), ("no_grad", "inference_mode", "set_grad_enabled")), False, False),
    "TGL101": ((("append", "extend", "insert", "+", "["),), False, True),
    "TGL102": ((("retain_graph",),), True, False),
    "TGL201": ((("no_grad", "inference_mode", "set_grad_enabled", "backward"),), False, False),
}
