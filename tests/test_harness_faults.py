"""Fault injection: the harness must report a disagreement or a clear error, never a false "agree".

Each case copies a real fixture into a temporary fixtures folder, injects one fault
(a repaired bad fixture, a broken ok fixture, forged output, a hang, a crash, a forged
result on the private channel, a wrong line), runs the harness on it and checks the
verdict. Control cases (output without a trailing newline, a relative --fixtures path)
must still agree.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torchgradlint.fixture_spec import load_fixtures  # noqa: E402
from torchgradlint.harness.runner import AGREE, DISAGREE, judge, lint_verdict, run_harness  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"

pytestmark = pytest.mark.slow


def _plant(tmp_path: Path, code: str, name: str, text: str) -> Path:
    folder = tmp_path / "fx" / code
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(text, encoding="utf-8")
    return tmp_path / "fx"


def _verdicts(root: Path, timeout: float = 60.0) -> dict:
    results = run_harness(root, ["cpu"], steps=3, timeout=timeout, jobs=2)
    return {r.fixture: r for r in results}


def _source(rel: str) -> str:
    return (FIXTURES / rel).read_text(encoding="utf-8")


BASIC_BAD = "TGL001/bad_basic_loop.py"
BASIC_OK = "TGL001/ok_zero_grad_each_step.py"


def test_fault_suite(tmp_path):
    """All faults in one harness run (two workers in parallel) to keep the suite short."""
    bad = _source(BASIC_BAD)
    ok = _source(BASIC_OK)
    # 1. repair a bad fixture (keep its name and its expectation)
    repaired = bad.replace("        optimizer.step()  # expect: TGL001",
                           "        optimizer.step()  # expect: TGL001\n        optimizer.zero_grad()")
    assert repaired != bad
    root = _plant(tmp_path, "TGL001", "bad_repaired.py", repaired)
    # 1b. repair it and drop the expectation: the linter agrees (silent), the probe must not
    _plant(tmp_path, "TGL001", "bad_repaired_quiet.py", repaired.replace("  # expect: TGL001", ""))
    # 2. break an ok fixture: drop its reset
    broken = re.sub(r"\n\s*optimizer\.zero_grad\(\)", "", ok)
    assert broken != ok
    _plant(tmp_path, "TGL001", "ok_broken.py", broken)
    # 3. forged output on stdout: a result-looking line saying healthy, without a newline
    forged = bad.replace("def main(", 'def _forge():\n    import json\n    print("TGL-HARNESS-RESULT " + json.dumps('
                         '{"measurement": {"defect": False}, "error": None}), end="")\n\n\ndef main(')
    forged = forged.replace("        optimizer.step()  # expect: TGL001",
                            "        optimizer.step()  # expect: TGL001\n        optimizer.zero_grad()\n"
                            "    _forge()")
    _plant(tmp_path, "TGL001", "bad_forged_stdout.py", forged)
    # 4. a forged result written to the private channel itself (without the run's nonce)
    channel = ok.replace("def main(", 'def _forge():\n    import os, sys\n    fd = int(sys.argv[sys.argv.index('
                         '"--result-fd") + 1])\n    os.write(fd, b\'{"measurement": {"defect": true, "figure": 1, '
                         '"unit": "steps", "display": "forged", "threshold": "", "findings": [{"code": "TGL001", '
                         '"stack": []}]}, "error": null}\')\n\n\ndef main(')
    channel = channel.replace("    for _ in range(steps):", "    _forge()\n    for _ in range(steps):", 1)
    _plant(tmp_path, "TGL001", "ok_forged_channel.py", channel)
    # 4b. garbage on the private channel
    garbage = ok.replace("    for _ in range(steps):", "    import os, sys\n    os.write(int(sys.argv[sys.argv.index("
                         "'--result-fd') + 1]), b'{not json')\n    for _ in range(steps):", 1)
    _plant(tmp_path, "TGL001", "ok_garbage_channel.py", garbage)
    # 5. hang
    _plant(tmp_path, "TGL001", "ok_hangs.py", ok.replace("    for _ in range(steps):",
                                                           "    import time\n    time.sleep(600)\n"
                                                           "    for _ in range(steps):", 1))
    # 6. crash: an exception, and a hard exit
    _plant(tmp_path, "TGL001", "bad_crashes.py", bad.replace("        optimizer.step()  # expect: TGL001",
                                                              "        optimizer.step()  # expect: TGL001\n"
                                                              "        raise ValueError('boom')"))
    _plant(tmp_path, "TGL001", "ok_exits.py", ok.replace("    for _ in range(steps):",
                                                           "    import os\n    os._exit(3)\n"
                                                           "    for _ in range(steps):", 1))
    # 7. the expectation on the wrong line: the linter disagrees, and the probe's line too
    lines = bad.splitlines()
    step = next(i for i, line in enumerate(lines) if "# expect: TGL001" in line)
    lines[step] = lines[step].replace("  # expect: TGL001", "")
    lines[step - 1] += "  # expect: TGL001"
    _plant(tmp_path, "TGL001", "bad_wrong_line.py", "\n".join(lines) + "\n")
    # controls: stdout without a trailing newline; the real fixtures copied verbatim
    _plant(tmp_path, "TGL001", "ok_no_newline.py",
           ok.replace("    for _ in range(steps):", "    print('no newline', end='')\n    for _ in range(steps):", 1))
    _plant(tmp_path, "TGL001", "bad_basic_loop.py", bad)

    got = _verdicts(root, timeout=20.0)
    must_disagree = ["bad_repaired", "bad_repaired_quiet", "ok_broken", "bad_forged_stdout", "ok_forged_channel",
                     "ok_garbage_channel", "ok_hangs", "bad_crashes", "ok_exits", "bad_wrong_line"]
    for name in must_disagree:
        r = got[f"TGL001/{name}"]
        assert r.verdict == DISAGREE, (name, r.problems)
    assert "measured no TGL001 defect" in " ".join(got["TGL001/bad_repaired_quiet"].problems)
    assert "measured a defect" in " ".join(got["TGL001/ok_broken"].problems)
    # the forged object and the worker's own arrive together: unsigned or unreadable, never believed
    err = got["TGL001/ok_forged_channel"].error
    assert "nonce" in err or "malformed result" in err
    assert "malformed result" in got["TGL001/ok_garbage_channel"].error
    assert got["TGL001/ok_hangs"].error.startswith("timeout")
    assert "ValueError: boom" in got["TGL001/bad_crashes"].error
    assert "without a result" in got["TGL001/ok_exits"].error
    assert any("expected TGL001 at line(s)" in p for p in got["TGL001/bad_wrong_line"].problems)
    for name in ("ok_no_newline", "bad_basic_loop"):
        assert got[f"TGL001/{name}"].verdict == AGREE, got[f"TGL001/{name}"].problems


def test_no_measurement_and_no_error_is_not_agreement():
    fixture = next(f for f in load_fixtures(FIXTURES) if f.name == "TGL001/ok_zero_grad_each_step")
    res = judge(fixture, "cpu", lint_verdict(fixture), {"seconds": 1.0}, "stale-gradients")
    assert res.verdict == DISAGREE
    assert "neither a measurement nor an error" in res.problems[0]


def test_measured_line_must_match_expected_line():
    fixture = next(f for f in load_fixtures(FIXTURES) if f.name == "TGL001/bad_basic_loop")
    finding = {"code": "TGL001", "stack": [[str(fixture.path), 3]], "figure": 1.0, "unit": "steps",
               "display": "elsewhere"}
    worker = {"measurement": {"defect": True, "figure": 1.0, "unit": "steps", "display": "x", "threshold": "t",
                              "findings": [finding]}}
    res = judge(fixture, "cpu", lint_verdict(fixture), worker, "stale-gradients")
    assert res.verdict == DISAGREE and res.lines == [3]
    line = next(line for code, line in fixture.expected)
    finding["stack"] = [[str(fixture.path), line]]
    assert judge(fixture, "cpu", lint_verdict(fixture), worker, "stale-gradients").verdict == AGREE
    # a finding of another rule is not this fixture's defect
    finding["code"] = "TGL101"
    assert judge(fixture, "cpu", lint_verdict(fixture), worker, "stale-gradients").verdict == DISAGREE


def test_relative_fixtures_path(tmp_path):
    root = _plant(tmp_path, "TGL001", "bad_basic_loop.py", _source(BASIC_BAD))
    proc = subprocess.run([sys.executable, "-m", "torchgradlint", "harness", "--device", "cpu", "--steps", "2",
                           "--fixtures", os.path.relpath(root, tmp_path), "-q"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1/1 fixture runs agree" in proc.stdout
