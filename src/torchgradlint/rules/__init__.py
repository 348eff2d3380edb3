"""One module per rule, named after the rule's kebab name (underscored).

Every module defines one :class:`~torchgradlint.registry.Rule` subclass that
declares everything about the rule (code, name, summary, default, docs,
harness probe, autofix); :func:`~torchgradlint.registry.all_rules` discovers
them. No list of rules is kept by hand anywhere: after adding or renaming a
rule run ``python scripts/gen_docs.py`` to regenerate the rule index, the docs
index, the mkdocs nav and the README table (tests check they are current).
"""
