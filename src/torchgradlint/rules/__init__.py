"""One module per rule, named after the rule's kebab name (underscored).

Every module defines one :class:`~torchgradlint.registry.Rule` subclass;
:func:`~torchgradlint.registry.all_rules` discovers them.
"""

# Every shipped rule's code, in order (tests/test_engine.py checks it against
# the discovered rules). The flake8 plugin decides from it whether any TGL
# rule is selected without importing the rules, and so LibCST.
RULE_CODES = ("TGL001", "TGL002", "TGL006", "TGL007", "TGL101", "TGL102", "TGL103", "TGL201", "TGL203")
