"""Which probe measures which rule: the one place that maps rule codes to probes (no torch needed).

A probe may measure several rules (``retained-graph`` reports TGL101 and TGL102
findings); each rule is measured by exactly one probe.
"""

from __future__ import annotations

#: rule code -> name of the probe that measures it
RULE_PROBES: dict[str, str] = {
    "TGL001": "stale-gradients",
    "TGL002": "grad-mode",
    "TGL101": "retained-graph",
    "TGL102": "retained-graph",
    "TGL201": "module-mode",
    "TGL104": "ctx-tensors",
    "TGL303": "probability-input",
    "TGL304": "gradcheck-power",
    "TGL305": "nan-parameters",
    "TGL006": "unoptimized-grads",
    "TGL007": "unoptimized-grads",
    "TGL103": "unused-graph",
    "TGL203": "eval-spread",
}


def probe_rules(probe: str) -> list[str]:
    """The rule codes ``probe`` measures, sorted (``[]`` for an unknown probe)."""
    return sorted(code for code, name in RULE_PROBES.items() if name == probe)


def probes_for(codes: "list[str] | None" = None) -> list[str]:
    """Probe names needed to measure ``codes`` (default: every rule), in a stable order.

    Raises:
        KeyError: a code no probe measures.
    """
    wanted = sorted(RULE_PROBES) if codes is None else [c.upper() for c in codes]
    out: list[str] = []
    for code in wanted:
        name = RULE_PROBES[code]
        if name not in out:
            out.append(name)
    return out
