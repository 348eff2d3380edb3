"""Plan fixtures x devices, lint each fixture, measure it in a worker subprocess, pair the verdicts.

No torch import here: workers (``python -m torchgradlint.harness.worker``) do the measuring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..engine import lint_file
from ..fixture_spec import Fixture, load_fixtures
from ..registry import all_rules
from .worker import RESULT_PREFIX

#: which probe judges the fixtures of each rule directory
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

AGREE, DISAGREE = "agree", "disagree"


@dataclass
class FixtureResult:
    """Both verdicts for one fixture on one device.

    ``flagged``: the linter reported the fixture's own code; ``lint_ok``: its findings
    equal the ``# expect:`` lines exactly; ``defect``: the probe measured the defect
    (``None`` when the run failed); ``verdict``: ``agree`` iff ``lint_ok`` and
    ``defect == (kind == "bad")``; ``problems`` says what disagrees (fixture, probe, figure).
    """

    fixture: str
    path: str
    rule: str
    kind: str
    device: str
    probe: Optional[str]
    flagged: bool
    expected: list[str]
    found: list[str]
    lint_ok: bool
    defect: Optional[bool] = None
    figure: Optional[float] = None
    unit: str = ""
    display: str = ""
    threshold: str = ""
    details: dict = field(default_factory=dict)
    error: Optional[str] = None
    verdict: str = DISAGREE
    problems: list[str] = field(default_factory=list)
    duration: float = 0.0
    torch: str = ""
    device_name: str = ""

    def to_json(self) -> dict:
        """JSON-able dict of every field."""
        return asdict(self)


def lint_verdict(fixture: Fixture) -> tuple[bool, bool, list[str], list[str]]:
    """``(flagged, lint_ok, expected, found)`` for a fixture under all rules.

    ``expected``/``found`` are sorted ``"TGL001:12"`` strings.
    """
    result = lint_file(str(fixture.path), all_rules())
    found = {(d.code, d.line) for d in result.diagnostics}
    flagged = any(code == fixture.code for code, _ in found)
    fmt = lambda pairs: sorted(f"{c}:{line}" for c, line in pairs)  # noqa: E731
    return flagged, found == set(fixture.expected), fmt(fixture.expected), fmt(found)


def run_worker(fixture: Fixture, probe: str, device: str, steps: int, timeout: float, seed: int = 0) -> dict:
    """Run one worker subprocess; return its JSON result, or ``{"error": ...}`` on timeout/crash."""
    cmd = [sys.executable, "-m", "torchgradlint.harness.worker", "--fixture", str(fixture.path),
           "--probe", probe, "--device", device, "--steps", str(steps), "--seed", str(seed)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # workers run in parallel; keep each single-threaded
    env.setdefault("PYTHONHASHSEED", "0")
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                              cwd=str(fixture.path.parent))
    except subprocess.TimeoutExpired:
        return {"error": f"timeout: no result within {timeout:g} s", "seconds": round(time.perf_counter() - start, 3)}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            result = json.loads(line[len(RESULT_PREFIX):])
            result["seconds"] = round(time.perf_counter() - start, 3)  # wall time, torch import included
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"error": f"worker exited {proc.returncode} without a result: {' | '.join(tail)}",
            "seconds": round(time.perf_counter() - start, 3)}


def judge(fixture: Fixture, device: str, lint: tuple[bool, bool, list[str], list[str]], worker: dict,
          probe: Optional[str]) -> FixtureResult:
    """Pair the lint verdict with the measured one."""
    flagged, lint_ok, expected, found = lint
    res = FixtureResult(fixture.name, str(fixture.path), fixture.code, fixture.kind, device, probe, flagged,
                        expected, found, lint_ok, duration=float(worker.get("seconds", 0.0)),
                        torch=worker.get("torch", ""), device_name=worker.get("device_name", device))
    if not lint_ok:
        res.problems.append(f"{fixture.name}: linter found {found or 'nothing'}, fixture expects "
                            f"{expected or 'nothing'}")
    if probe is None:
        res.problems.append(f"{fixture.name}: no probe for rule {fixture.code}")
    m = worker.get("measurement")
    if worker.get("error"):
        res.error = worker["error"]
        res.problems.append(f"{fixture.name} [{probe} on {device}]: run failed: {res.error}")
    elif m:
        res.defect = bool(m["defect"])
        res.figure, res.unit, res.display = m["figure"], m["unit"], m["display"]
        res.threshold, res.details = m["threshold"], m.get("details", {})
        want = fixture.kind == "bad"
        if res.defect != want:
            what = "measured a defect" if res.defect else "measured no defect"
            res.problems.append(f"{fixture.name} [{probe} on {device}]: {what} ({res.display}; threshold: "
                                f"{res.threshold}) but it is a {fixture.kind} fixture")
    res.verdict = AGREE if not res.problems else DISAGREE
    return res


def run_harness(
    fixtures_dir: Path,
    devices: Sequence[str],
    rules: Optional[Sequence[str]] = None,
    steps: int = 10,
    timeout: float = 120.0,
    jobs: int = 2,
    progress: Optional[Callable[[FixtureResult], None]] = None,
) -> list[FixtureResult]:
    """Lint and measure every fixture of ``rules`` (default: all) under ``fixtures_dir`` on ``devices``.

    Workers run ``jobs`` at a time, each limited to ``timeout`` seconds.
    Results are sorted by rule, fixture name and device.

    Raises:
        FileNotFoundError: ``fixtures_dir`` is not a directory.
    """
    fixtures = load_fixtures(fixtures_dir)
    if rules:
        wanted = {r.upper() for r in rules}
        fixtures = [f for f in fixtures if f.code in wanted]
    lints = {f.name: lint_verdict(f) for f in fixtures}
    tasks = [(f, d) for f in fixtures for d in devices]

    def one(task: tuple[Fixture, str]) -> FixtureResult:
        fixture, device = task
        probe = RULE_PROBES.get(fixture.code)
        worker = run_worker(fixture, probe, device, steps, timeout) if probe else {}
        res = judge(fixture, device, lints[fixture.name], worker, probe)
        if progress is not None:
            progress(res)
        return res

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, tasks))
    return sorted(results, key=lambda r: (r.rule, r.fixture, r.device))
