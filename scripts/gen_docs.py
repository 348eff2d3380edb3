#!/usr/bin/env python3
"""Generate docs/rules/<CODE>.md and docs/harness.md from rule metadata and a harness JSON report.

Usage::

    torchgradlint harness --device all --format json --output report.json
    python scripts/gen_docs.py --harness-json report.json [--docs-dir docs]

Each rule page: title, summary, the rule's ``docs`` Markdown, and an "Evidence"
section with the measured figure of every fixture per device (CUDA "not run" when
the report has no CUDA run). Output is deterministic for a given report: no
timestamps, only the torch version and devices. Needs no torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from torchgradlint.harness.report import NOT_RUN, evidence_rows, load_report, render_markdown  # noqa: E402
from torchgradlint.registry import all_rules  # noqa: E402


def rule_page(rule: type, report: Optional[dict]) -> str:
    """Markdown page of one rule: metadata, docs and measured evidence from ``report``."""
    out = [f"# {rule.code}: {rule.name}", "", rule.summary.strip(), ""]
    if not rule.default_enabled:
        out += ["*Off by default; enable with `--select " + rule.code + "`.*", ""]
    out += [rule.docs.strip(), "", "## Evidence", ""]
    rows = evidence_rows(report, rule.code) if report else []
    if len(rows) <= 2:
        out.append("No harness evidence recorded for this rule.")
    else:
        devices = report["devices"]
        cuda = devices.get("cuda", NOT_RUN)
        out.append(f"Measured by `torchgradlint harness` (torch {report['torch']}; "
                   f"{report['steps']} and {2 * report['steps']} steps, {4 * report['steps']} for retained-graph). CUDA: "
                   f"{'run' if cuda == 'run' else cuda}.")
        probes = {r["probe"] for r in report["results"] if r["rule"] == rule.code and r["probe"]}
        for name in sorted(probes):
            p = report["probes"].get(name)
            if p:
                out.append(f"Probe `{name}` ({p['unit']}): defect when {p['threshold']}.")
        out += [""] + rows
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Write the pages; returns 0, or 2 when the report cannot be read."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--harness-json", type=Path, help="report from `torchgradlint harness --format json`")
    p.add_argument("--docs-dir", type=Path, default=ROOT / "docs")
    args = p.parse_args(argv)
    report = None
    if args.harness_json:
        try:
            report = load_report(args.harness_json.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"gen_docs: error: {args.harness_json}: {exc}", file=sys.stderr)
            return 2
    rules_dir = args.docs_dir / "rules"
    rules_dir.mkdir(parents=True, exist_ok=True)
    for rule in all_rules():
        (rules_dir / f"{rule.code}.md").write_text(rule_page(rule, report), encoding="utf-8")
    if report is not None:
        (args.docs_dir / "harness.md").write_text(render_markdown(report), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
