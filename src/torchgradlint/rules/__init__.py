"""One module per rule, named after the rule's kebab name (underscored).

Every module defines one :class:`~torchgradlint.registry.Rule` subclass;
:func:`~torchgradlint.registry.all_rules` discovers them.
"""
