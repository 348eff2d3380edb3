"""Which probe measures which rule, read from the rules' own ``probe``
declarations (:attr:`torchgradlint.registry.Rule.probe`): no list is kept by
hand here.

A probe may measure several rules (``retained-graph`` reports TGL101 and TGL102
findings); each rule is measured by exactly one probe.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _rule_probes() -> tuple[tuple[str, str], ...]:
    from ..registry import all_rules

    return tuple((r.code, r.probe) for r in all_rules() if r.probe)


def rule_probes() -> dict[str, str]:
    """``rule code -> probe name`` for every rule that declares a probe."""
    return dict(_rule_probes())


def probe_rules(probe: str) -> list[str]:
    """The rule codes ``probe`` measures, sorted (``[]`` for an unknown probe)."""
    return sorted(code for code, name in _rule_probes() if name == probe)


def probes_for(codes: "list[str] | None" = None) -> list[str]:
    """Probe names needed to measure ``codes`` (default: every rule), in a stable order.

    Raises:
        KeyError: a code no probe measures.
    """
    table = rule_probes()
    wanted = sorted(table) if codes is None else [c.upper() for c in codes]
    out: list[str] = []
    for code in wanted:
        name = table[code]
        if name not in out:
            out.append(name)
    return out
