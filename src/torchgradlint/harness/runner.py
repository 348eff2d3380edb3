"""Plan fixtures x devices, lint each fixture, measure it in a worker subprocess, pair the verdicts.

No torch import here: workers (``python -m torchgradlint.harness.worker``) do the measuring.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from ..engine import lint_file
from ..fixture_spec import Fixture, load_fixtures
from ..registry import all_rules
from .probe_map import rule_probes

AGREE, DISAGREE = "agree", "disagree"


@dataclass
class FixtureResult:
    """Both verdicts for one fixture on one device.

    ``flagged``: the linter reported the fixture's own code; ``lint_ok``: its findings
    equal the ``# expect:`` lines exactly; ``defect``: the probe measured the defect
    (``None`` when the run failed); ``findings``: the probe's measured defects with their
    call stacks; ``lines``: fixture lines the probe attributes the defect to (``None`` when
    not judged, ``[]`` with ``line_note`` when the probe attributes none); ``verdict``:
    ``agree`` iff nothing in ``problems`` (which says what disagrees: fixture, probe, figure).
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
    findings: list = field(default_factory=list)
    lines: Optional[list] = None
    line_note: str = ""
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
    """Run one worker subprocess; return its JSON result, or ``{"error": ...}``.

    The result comes over a private pipe and must carry this run's nonce (sent on the
    worker's standard input before the fixture is imported), so whatever the fixture
    prints, even a forged result, is never read as one. Timeouts, crashes, a missing,
    malformed or unsigned result each give a clear ``error``.
    """
    read_fd, write_fd = os.pipe()
    nonce = secrets.token_hex(16)
    cmd = [sys.executable, "-m", "torchgradlint.harness.worker", "--fixture", str(fixture.path.resolve()),
           "--probe", probe, "--device", device, "--steps", str(steps), "--seed", str(seed),
           "--result-fd", str(write_fd)]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # workers run in parallel; keep each single-threaded
    env.setdefault("PYTHONHASHSEED", "0")
    start = time.perf_counter()
    chunks: list[bytes] = []

    def drain() -> None:
        with os.fdopen(read_fd, "rb") as fh:
            chunks.append(fh.read())

    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=str(fixture.path.resolve().parent), pass_fds=(write_fd,),
                                start_new_session=True)
    finally:
        os.close(write_fd)
    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        _, err = proc.communicate(input=(nonce + "\n").encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        reader.join(5)
        return {"error": f"timeout: no result within {timeout:g} s", "seconds": round(time.perf_counter() - start, 3)}
    reader.join(30)
    seconds = round(time.perf_counter() - start, 3)
    raw = b"".join(chunks).decode("utf-8", errors="replace").strip()
    tail = " | ".join(err.decode("utf-8", errors="replace").strip().splitlines()[-3:])
    if not raw:
        return {"error": f"worker exited {proc.returncode} without a result: {tail}", "seconds": seconds}
    try:
        result = json.loads(raw)
        if not isinstance(result, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return {"error": f"malformed result from the worker ({exc}): {raw[:120]!r}", "seconds": seconds}
    if result.get("nonce") != nonce:
        return {"error": "result without this run's nonce: not from the harness's worker", "seconds": seconds}
    m = result.get("measurement")
    if m is not None and (not isinstance(m, dict) or not {"defect", "figure", "unit", "display", "threshold"} <= set(m)
                          or not isinstance(m.get("findings", []), list)):
        return {"error": f"malformed measurement from the worker: {str(m)[:120]!r}", "seconds": seconds}
    result["seconds"] = seconds  # wall time, torch import included
    return result


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # pragma: no cover - already gone
        proc.kill()


def _fixture_lines(finding: dict, path: Path) -> list[int]:
    """Lines of ``path`` on a finding's call stack."""
    target = str(path.resolve())
    return [int(line) for p, line in finding.get("stack", []) if str(Path(p).resolve()) == target]


def judge(fixture: Fixture, device: str, lint: tuple[bool, bool, list[str], list[str]], worker: dict,
          probe: Optional[str]) -> FixtureResult:
    """Pair the lint verdict with the measured one, line by line where the probe attributes lines.

    A bad fixture agrees when the linter finds exactly its ``# expect:`` lines and the probe
    measures a defect of the fixture's rule; where the probe attributes the defect to call
    stacks in the fixture, every expected line of the rule must be on one of them and every
    attributed finding must touch an expected line. An ok fixture agrees when the linter is
    silent and the probe measures nothing. A run with neither measurement nor error disagrees.
    """
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
    where = f"{fixture.name} [{probe} on {device}]"
    if worker.get("error"):
        res.error = str(worker["error"])
        res.problems.append(f"{where}: run failed: {res.error}")
    elif not m:
        if probe is not None:
            res.error = "no measurement and no error"
            res.problems.append(f"{where}: the run gave neither a measurement nor an error")
    else:
        own = [f for f in m.get("findings", []) if f.get("code") == fixture.code]
        if not m.get("findings"):  # a probe that reports no findings decides for its rule as a whole
            own = [{"code": fixture.code, "stack": [], "display": m["display"]}] if m["defect"] else []
        res.defect = bool(own) if fixture.kind == "bad" else bool(m["defect"])
        res.figure, res.unit, res.display = m["figure"], m["unit"], m["display"]
        res.threshold, res.details = m["threshold"], m.get("details", {})
        res.findings = m.get("findings", [])
        if fixture.kind == "bad" and not res.defect:
            other = sorted({f.get("code") for f in m.get("findings", [])} - {fixture.code})
            res.problems.append(f"{where}: measured no {fixture.code} defect ({res.display}; threshold: "
                                f"{res.threshold})" + (f"; measured {', '.join(other)} instead" if other else "")
                                + " but it is a bad fixture")
        elif fixture.kind == "ok" and res.defect:
            res.problems.append(f"{where}: measured a defect ({res.display}; threshold: {res.threshold}) "
                                f"but it is an ok fixture")
        if fixture.kind == "bad" and own:
            want = sorted(line for code, line in fixture.expected if code == fixture.code)
            attributed = [(f, _fixture_lines(f, fixture.path)) for f in own]
            if any(lines for _, lines in attributed):
                seen = {line for _, lines in attributed for line in lines}
                missing = [line for line in want if line not in seen]
                stray = [f["display"] for f, lines in attributed if lines and not set(lines) & set(want)]
                res.lines = sorted(seen)
                if missing:
                    res.problems.append(f"{where}: expected {fixture.code} at line(s) {missing}, the probe "
                                        f"attributes the defect to line(s) {sorted(seen)}")
                if stray:
                    res.problems.append(f"{where}: defect measured away from every expected line: {stray[0]}")
            else:
                res.lines = []
                res.line_note = "the probe attributes no line"
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
    fixtures = load_fixtures(Path(fixtures_dir).resolve())
    if rules:
        wanted = {r.upper() for r in rules}
        fixtures = [f for f in fixtures if f.code in wanted]
    lints = {f.name: lint_verdict(f) for f in fixtures}
    tasks = [(f, d) for f in fixtures for d in devices]

    def one(task: tuple[Fixture, str]) -> FixtureResult:
        fixture, device = task
        probe = rule_probes().get(fixture.code)
        worker = run_worker(fixture, probe, device, steps, timeout) if probe else {}
        res = judge(fixture, device, lints[fixture.name], worker, probe)
        if progress is not None:
            progress(res)
        return res

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, tasks))
    return sorted(results, key=lambda r: (r.rule, r.fixture, r.device))
