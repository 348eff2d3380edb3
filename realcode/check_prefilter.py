#!/usr/bin/env python
"""Check the prefilter's claims against the full analysis on the real-code
corpus (``.cache/realcode/src``, filled by ``lint_real.py``).

For every ``.py`` file that stage 2 would keep away from LibCST (for TGL101),
parse it anyway and ask the analysis whether any backward call or any fact
running with grad mode known enabled in a loop, a function or on ``self``
exists; for every torch file that stage 1 says cannot call a backward (so
the rules with ``needs_backward`` are dropped), whether the analysis finds a
backward call; and for every torch file, whether a rule whose own premise
(``Rule.ast_prefilter``) is ``False`` reports anything
(``tests/prefilter_oracle.py``). Prints the counts and every
counterexample; exits 1 if there is one.

Usage::

    python realcode/check_prefilter.py [SRC_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import libcst as cst  # noqa: E402

from prefilter_oracle import backward_counterexamples, counterexamples, premise_counterexamples  # noqa: E402
from torchgradlint.engine import decode_source  # noqa: E402
from torchgradlint.prefilter import TORCH_HINTS, lacks_grad_evidence, may_call_backward  # noqa: E402
from torchgradlint.registry import get_rule  # noqa: E402


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else ROOT / ".cache" / "realcode" / "src"
    if not src.is_dir():
        print(f"error: {src} is not a directory (run realcode/lint_real.py first)", file=sys.stderr)
        return 2
    tgl101 = get_rule("TGL101")
    files = candidates = rejected = no_backward = unparsable = premise_checked = 0
    bad: list[str] = []
    for path in sorted(p for p in src.rglob("*.py") if p.is_file()):  # (a folder may be named x.py)
        files += 1
        try:
            text = decode_source(path.read_bytes())
        except (UnicodeDecodeError, SyntaxError, LookupError):
            continue
        if not any(h in text for h in TORCH_HINTS):
            continue
        name = str(path.relative_to(src))
        backward_claim = not may_call_backward(text)
        candidate = tgl101.may_fire(text)
        stage2_claim = candidate and lacks_grad_evidence(text)  # implies backward_claim
        no_backward += backward_claim
        candidates += candidate
        rejected += stage2_claim
        try:  # one LibCST parse per file: stage 2's oracle also checks for backward calls
            if stage2_claim:
                bad += counterexamples(text, name)
            elif backward_claim:
                bad += backward_counterexamples(text, name)
            bad += premise_counterexamples(text, name)
            premise_checked += 1
        except (cst.ParserSyntaxError, RecursionError):
            unparsable += 1
    print(f"{files} files, {no_backward} torch files that cannot call a backward (stage 1), {candidates} pass "
          f"TGL101's text stage, {rejected} kept from LibCST by stage 2, {premise_checked} checked against the rules' "
          f"own premises, {unparsable} LibCST cannot parse, "
          f"{len(bad)} counterexamples")
    for line in bad:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
