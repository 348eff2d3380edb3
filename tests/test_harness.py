"""The harness end to end (CLI on a tiny fixtures dir), device selection, reports and gen_docs."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from torchgradlint.cli import main as tgl_main  # noqa: E402
from torchgradlint.harness import cli as harness_cli  # noqa: E402
from torchgradlint.harness.devices import DeviceError, select_devices  # noqa: E402
from torchgradlint.harness.report import build_report, render  # noqa: E402
from torchgradlint.harness.runner import FixtureResult  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "harness_programs"


def test_select_devices():
    assert select_devices("cpu", cuda=True) == ["cpu"]
    assert select_devices("all", cuda=False) == ["cpu"]
    assert select_devices("all", cuda=True) == ["cpu", "cuda"]
    assert select_devices("cuda", cuda=True) == ["cuda"]
    with pytest.raises(DeviceError):
        select_devices("cuda", cuda=False)
    with pytest.raises(ValueError):
        select_devices("tpu", cuda=False)


def test_cuda_without_gpu_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(harness_cli, "cuda_available", lambda: False)
    assert tgl_main(["harness", "--device", "cuda", "--fixtures", str(PROGRAMS / "fixtures")]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_unknown_rule_and_missing_dir(capsys):
    assert harness_cli.main(["--rule", "TGL999"]) == 2
    assert harness_cli.main(["--device", "cpu", "--fixtures", str(PROGRAMS / "nowhere")]) == 2


def _result(device: str, kind: str, defect: bool) -> FixtureResult:
    return FixtureResult(f"TGL001/{kind}_x", "x.py", "TGL001", kind, device, "stale-gradients",
                         kind == "bad", [], [], True, defect=defect, figure=1.0, unit="steps",
                         display=f"stale-gradient steps: {int(defect)}/8", threshold=">= 1", verdict="agree",
                         device_name="NVIDIA H100" if device == "cuda" else "cpu")


def test_report_columns_with_and_without_cuda():
    cpu_only = build_report([_result("cpu", "bad", True)], ["cpu"], "no CUDA device", 10, "2.13.0")
    md = render(cpu_only, "markdown")
    assert "CUDA: not run (no CUDA device)" in md
    assert "| `bad_x` | bad | flagged | stale-gradient steps: 1/8 | defect, agree | not run | not run |" in md
    both = build_report([_result("cpu", "bad", True), _result("cuda", "bad", True)], ["cpu", "cuda"], "",
                        10, "2.13.0")
    md = render(both, "markdown")
    assert "CUDA: run (NVIDIA H100)" in md and "| not run |" not in md
    assert json.loads(render(both, "json"))["devices"] == {"cpu": "run", "cuda": "run"}
    assert "cuda" in render(both, "table")


def test_harness_cli_end_to_end(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torchgradlint", "harness", "--device", "all", "--steps", "3",
         "--fixtures", str(PROGRAMS / "fixtures"), "--format", "json", "--output", str(out), "-q"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["agree"] is True
    assert report["devices"]["cpu"] == "run"
    assert report["devices"]["cuda"].startswith("not run")
    rows = {r["fixture"]: r for r in report["results"]}
    bad, ok = rows["TGL001/bad_no_reset"], rows["TGL001/ok_reset"]
    assert bad["flagged"] and bad["defect"] and bad["display"] == "stale-gradient steps: 2/3"
    assert not ok["flagged"] and ok["defect"] is False
    for r in report["results"]:
        for key in ("rule", "kind", "device", "flagged", "expected", "figure", "unit", "threshold", "defect",
                    "verdict", "duration"):
            assert key in r
    assert "agree" in proc.stdout  # the table goes to stdout when --output is given

    root = tmp_path / "checkout"  # gen_docs writes into a copy of the files it edits in place
    root.mkdir()
    for name in ("README.md", "mkdocs.yml"):
        shutil.copy(ROOT / name, root / name)
    docs = root / "docs"
    gen = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--harness-json", str(out),
                          "--root", str(root)], capture_output=True, text=True, timeout=60)
    assert gen.returncode == 0, gen.stderr
    page = (docs / "rules" / "TGL001.md").read_text()
    assert "## Evidence" in page and "stale-gradient steps: 2/3" in page and "not run" in page
    unmeasured = (docs / "rules" / "TGL201.md").read_text()  # no fixture of it in this report: a page all the same
    assert unmeasured.startswith("# TGL201: no-grad-without-eval") and "No harness evidence recorded" in unmeasured
    assert "- TGL201 no-grad-without-eval: rules/TGL201.md" in (root / "mkdocs.yml").read_text()
    harness_md = (docs / "harness.md").read_text()
    assert "TGL001" in harness_md
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--harness-json", str(out),
                    "--root", str(root)], check=True, timeout=60)
    assert (docs / "harness.md").read_text() == harness_md  # deterministic


def test_disagreement_exits_nonzero_and_names_fixture_probe_figure():
    proc = subprocess.run(
        [sys.executable, "-m", "torchgradlint", "harness", "--device", "cpu", "--steps", "3",
         "--fixtures", str(PROGRAMS / "fixtures_disagree"), "-q"],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "TGL001/ok_but_defective [stale-gradients on cpu]: measured a defect (stale-gradient steps: 2/3" \
        in proc.stdout
