"""Harness reports: table (terminal), json (machine), markdown (docs/harness.md). No torch needed.

A report is built from a JSON-able *report dict* (what ``--format json`` prints)::

    {"torch": "2.13.0+cpu", "steps": 10,
     "devices": {"cpu": "run", "cuda": "not run (no CUDA device: ...)"},
     "probes": {"stale-gradients": {"rules": [...], "unit": ..., "threshold": ...}, ...},
     "results": [FixtureResult.to_json(), ...], "agree": true}
"""

from __future__ import annotations

import json
from typing import Iterable

from .probe_map import probe_rules
from .runner import AGREE, FixtureResult

NOT_RUN = "not run"

HOW_PROBES_DECIDE = """## How the verdicts are made

A fixture run **agrees** when all of these hold:

- the linter reports exactly the fixture's `# expect: CODE` lines;
- a `bad_*` fixture: its probe measures a defect *of the fixture's rule*; where the probe attributes
  the defect to call stacks in the fixture, every expected line of the rule is on one of them and every
  attributed finding touches an expected line (agreement per line, not per fixture);
- an `ok_*` fixture: its probe measures no defect;
- the run gave a measurement: a run with neither a measurement nor an error, a time-out, a crash, or a
  result that did not come over the worker's private channel signed with the run's nonce is a
  disagreement, never an agreement.

The worker sends its result over a pipe whose write end only it holds, signed with a nonce it read from
standard input before the fixture was imported; what a fixture prints (a forged result line, output
without a trailing newline) is never read as a result.

How each probe decides (figures with their units):

- **stale-gradients** (TGL001, steps): per optimizer and per parameter group, a step is *stale* when a
  backward added into a gradient that an earlier `step()` of that optimizer already consumed and nothing
  reset it since. Gradients are identified by a weak reference to the tensor and its version counter (no
  copy, and no address a new gradient can reuse);
  a stale sum scaled in place before the step (`scaler.unscale_`, `clip_grad_norm_`) stays stale unless it
  was zeroed (one reduction, only for parameters that hold a stale sum).
  Defect: >= 1 stale step.
- **grad-mode** (TGL002, failures): only at a backward / `autograd.grad` call: autograd's "does not
  require grad" error when grad mode is the cause (an inference tensor, grad mode off at the call, or a
  module with trainable parameters run under no_grad since the last backward); a backward whose graph
  reaches no parameter after such a no_grad forward (silent failure); a `create_graph=True` result that
  the backward run right after it does not use (one followed by no backward, an evaluation metric, is not
  claimed). A `.detach()` bug or an error raised elsewhere is not claimed. Defect: >= 1.
- **retained-graph** (TGL101, TGL102): checkpoints at the end of `main` and at each backward; least-squares
  slope over N, 2N, 4N steps, and the value at 4N above the value at N. TGL102: >= 0.5 graphs/step kept by
  `retain_graph=True` still alive at the next forward and never backpropagated again, or graph growth while
  retained graphs are backpropagated again (state carried across iterations), or a backward through a
  retained graph after an optimizer step changed weights it saved ("modified by an inplace operation":
  saved-tensor hooks skip autograd's version check, so the probe makes it and the program fails as it
  does without the probe). TGL101: graph nodes
  >= 0.1 node/step, saved tensors >= 256 B/step, or saved tensors at their peak >= 1 KiB/step. Saved bytes
  count the bytes each saved view spans (a slice of a preallocated dataset counts the slice).
- **module-mode** (TGL201, calls): dropout (`F.dropout` and variants, `nn.Dropout`, `nn.MultiheadAttention`,
  SDPA `dropout_p > 0`) or batch norm updating running statistics, in training mode, with grad mode off.
  Not counted: inside `torch.optim.swa_utils.update_bn`, when the outermost module called is in eval mode
  (Monte-Carlo dropout), and dropout (not batch norm) in Monte-Carlo sampling after an explicit `train()`: the
  module run at one site on one input at least twice while the switch holds, with no backward meanwhile;
  nor the calls of a training forward run under no_grad by mistake (made from the function whose next
  backward fails with autograd's grad-mode error: TGL002's defect). Defect: >= 1 call."""
DEVICE_LABELS = {"cpu": "CPU", "cuda": "CUDA"}


def build_report(results: Iterable[FixtureResult], run_devices: list[str], cuda_note: str,
                 steps: int, torch_version: str) -> dict:
    """The report dict for ``results``; devices not in ``run_devices`` are marked not run."""
    results = list(results)
    devices = {}
    for d in ("cpu", "cuda"):
        if d in run_devices:
            devices[d] = "run"
        else:
            devices[d] = f"{NOT_RUN} ({cuda_note})" if d == "cuda" else f"{NOT_RUN} (not requested)"
    probes: dict[str, dict] = {}
    for r in results:
        if r.probe and r.threshold and r.probe not in probes:
            probes[r.probe] = {"rules": probe_rules(r.probe),
                               "unit": r.unit, "threshold": r.threshold}
    names = {r.device: r.device_name for r in results if r.device_name}
    return {
        "torch": torch_version,
        "steps": steps,
        "devices": devices,
        "device_names": names,
        "probes": dict(sorted(probes.items())),
        "results": [r.to_json() for r in results],
        "agree": all(r["verdict"] == AGREE for r in (x.to_json() for x in results)) and bool(results),
    }


def _figure(r: dict) -> str:
    if r.get("error"):
        return "error: " + r["error"].splitlines()[0][:70]
    text = r.get("display") or "-"
    if r.get("lines"):
        text += f" @ line {', '.join(str(x) for x in r['lines'])}"
    return text


def _lint_cell(r: dict) -> str:
    text = "flagged" if r["flagged"] else "silent"
    if not r["lint_ok"]:
        text += " (mismatch)"
    return text


def _measured_cell(r: dict) -> str:
    if r.get("defect") is None:
        return "?"
    return "defect" if r["defect"] else "healthy"


def render_json(report: dict) -> str:
    """The report dict as indented, key-sorted JSON text."""
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def render_table(report: dict) -> str:
    """A plain-text table for the terminal, then the disagreements, then a summary line."""
    rows = [("fixture", "device", "linter", "measured", "figure", "verdict")]
    for r in report["results"]:
        rows.append((r["fixture"], r["device"], _lint_cell(r), _measured_cell(r), _figure(r), r["verdict"]))
    for dev, state in report["devices"].items():
        if state != "run":
            rows.append(("(all)", dev, "-", "-", state, "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    problems = [p for r in report["results"] for p in r["problems"]]
    if problems:
        lines.append("")
        lines.append("Disagreements:")
        lines.extend(f"  - {p}" for p in problems)
    n = len(report["results"])
    bad = sum(r["verdict"] != AGREE for r in report["results"])
    lines.append("")
    lines.append(f"{n - bad}/{n} fixture runs agree" + ("" if not bad else f"; {bad} disagree"))
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def evidence_rows(report: dict, rule: str) -> list[str]:
    """Markdown table rows (header included) of one rule's fixtures, CPU and CUDA columns."""
    by_fixture: dict[str, dict[str, dict]] = {}
    kinds: dict[str, str] = {}
    for r in report["results"]:
        if r["rule"] != rule:
            continue
        by_fixture.setdefault(r["fixture"], {})[r["device"]] = r
        kinds[r["fixture"]] = r["kind"]
    head = ["| fixture | kind | linter | CPU: measured | CPU | CUDA: measured | CUDA |",
            "|---|---|---|---|---|---|---|"]
    rows = []
    for name in sorted(by_fixture, key=lambda n: (kinds[n] != "bad", n)):
        devs = by_fixture[name]
        any_r = next(iter(devs.values()))
        cells = [f"`{name.split('/', 1)[1]}`", kinds[name], _lint_cell(any_r)]
        for d in ("cpu", "cuda"):
            r = devs.get(d)
            if r is None:
                cells += [NOT_RUN, NOT_RUN]
            else:
                cells += [_md_escape(_figure(r)), f"{_measured_cell(r)}, {r['verdict']}"]
        rows.append("| " + " | ".join(cells) + " |")
    return head + rows


def _device_line(report: dict) -> str:
    parts = []
    for dev, state in report["devices"].items():
        label = DEVICE_LABELS.get(dev, dev)
        if state == "run":
            name = report.get("device_names", {}).get(dev, dev)
            parts.append(f"{label}: run ({name})")
        else:
            parts.append(f"{label}: {state}")
    return "; ".join(parts)


def render_markdown(report: dict, title: str = "Runtime harness report") -> str:
    """docs/harness.md: probes and thresholds, then per rule each fixture with flagged / figure / verdict.

    Deterministic for a given report: no timestamps or durations, only the torch
    version and devices.
    """
    rules = sorted({r["rule"] for r in report["results"]})
    total = len(report["results"])
    agree = sum(r["verdict"] == AGREE for r in report["results"])
    out = [f"# {title}", "",
           "Generated by `torchgradlint harness --format markdown` (or `scripts/gen_docs.py`); do not edit.",
           "",
           f"torch {report['torch']}; {report['steps']} and {2 * report['steps']} steps per fixture "
           f"({4 * report['steps']} too for retained-graph); "
           f"{_device_line(report)}.",
           "",
           f"**{agree}/{total} fixture runs agree** (flagged by the linter ⇔ defect measured).",
           "",
           "Each fixture runs in its own subprocess, seeded, at N and 2N steps (N, 2N and 4N for "
           "`retained-graph`), with the probe of its rule installed from outside the fixture. CUDA columns say "
           "\"not run\" when no GPU was present. \"@ line\" names the fixture lines the probe attributes the "
           "defect to (the call stack of the stepping optimizer, the backward, the store that keeps a graph, "
           "the module call under no_grad).",
           "", HOW_PROBES_DECIDE, "", "## Probes", "", "| probe | rules | unit | defect when |", "|---|---|---|---|"]
    for name, p in report["probes"].items():
        out.append(f"| {name} | {', '.join(p['rules'])} | {p['unit']} | {_md_escape(p['threshold'])} |")
    for rule in rules:
        out += ["", f"## {rule}", ""]
        out += evidence_rows(report, rule)
    problems = [p for r in report["results"] for p in r["problems"]]
    if problems:
        out += ["", "## Disagreements", ""]
        out += [f"- {_md_escape(p)}" for p in problems]
    return "\n".join(out) + "\n"


def render(report: dict, fmt: str) -> str:
    """Render in ``table``, ``json`` or ``markdown``.

    Raises:
        ValueError: unknown format.
    """
    if fmt == "table":
        return render_table(report)
    if fmt == "json":
        return render_json(report)
    if fmt == "markdown":
        return render_markdown(report)
    raise ValueError(f"unknown format {fmt!r}")


def load_report(text: str) -> dict:
    """Parse a JSON report (from ``--format json``).

    Raises:
        ValueError: not a harness report.
    """
    data = json.loads(text)
    if not isinstance(data, dict) or "results" not in data or "devices" not in data:
        raise ValueError("not a torchgradlint harness JSON report")
    return data


__all__ = ["build_report", "render", "render_table", "render_json", "render_markdown", "evidence_rows",
           "load_report", "NOT_RUN"]
