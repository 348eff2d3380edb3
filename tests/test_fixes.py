"""Autofix: only the flagged span changes, results parse, a second run changes nothing."""

import subprocess
import sys

from torchgradlint.diagnostics import Diagnostic, Fix
from torchgradlint.fixes import apply_edits, fix_until_stable, unified_diff


def diag(line, c1, c2, text, safe=True):
    return Diagnostic("TGL101", "m", "x.py", line, c1, line, c2, Fix((line, c1), (line, c2), text, safe))


SRC = "a = f(loss)\nb = g(loss)  # keep me\n"


def test_only_the_span_changes():
    out = apply_edits(SRC, [diag(1, 7, 11, "loss.item()")])
    assert out.source == "a = f(loss.item())\nb = g(loss)  # keep me\n"
    assert len(out.applied) == 1


def test_unsafe_fixes_need_opt_in():
    d = diag(1, 7, 11, "loss.item()", safe=False)
    assert apply_edits(SRC, [d]).source == SRC
    assert apply_edits(SRC, [d], unsafe=True).source != SRC


def test_overlapping_fixes_wait_for_the_next_round():
    out = apply_edits(SRC, [diag(1, 5, 12, "X"), diag(1, 7, 11, "Y")])
    assert out.source == "a = X\nb = g(loss)  # keep me\n"
    assert len(out.applied) == 1


def test_a_fix_that_would_not_parse_is_not_applied():
    out = apply_edits(SRC, [diag(1, 7, 11, "loss.(")])
    assert out.source == SRC and out.applied == []


def test_fix_until_stable_reaches_a_fixed_point():
    calls = []

    def lint(text):
        calls.append(text)
        return [diag(1, 7, 11, "loss.item()")] if "f(loss)" in text else []

    out = fix_until_stable(SRC, lint)
    assert out.source.startswith("a = f(loss.item())")
    assert fix_until_stable(out.source, lint).source == out.source  # idempotent


def test_unified_diff():
    text = unified_diff("x.py", SRC, SRC.replace("f(loss)", "f(loss.item())"))
    assert text.startswith("--- a/x.py\n+++ b/x.py\n")
    assert "-a = f(loss)\n+a = f(loss.item())\n" in text


FIXTURE = __import__("pathlib").Path(__file__).resolve().parent.parent / "fixtures" / "TGL101" / "bad_losses_append.py"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "torchgradlint", "check", *args], capture_output=True, text=True)


def test_cli_fix_end_to_end(tmp_path):
    target = tmp_path / "train.py"
    original = FIXTURE.read_text()
    target.write_text(original)

    out = cli("--fix", "--show-fixes", str(target))
    assert "Traceback" not in out.stderr
    assert "Fixed" in out.stderr and "TGL101" in out.stderr
    fixed = target.read_text()
    changed = [(a, b) for a, b in zip(original.splitlines(), fixed.splitlines()) if a != b]
    assert changed == [("        losses.append(loss)  # expect: TGL101",
                        "        losses.append(loss.item())  # expect: TGL101")]
    assert len(original.splitlines()) == len(fixed.splitlines())
    compile(fixed, str(target), "exec")
    assert out.returncode == 0, out.stdout  # nothing remains

    again = cli("--fix", str(target))
    assert target.read_text() == fixed and again.returncode == 0  # idempotent


def test_cli_diff_does_not_write(tmp_path):
    target = tmp_path / "train.py"
    target.write_text(FIXTURE.read_text())
    out = cli("--diff", str(target))
    assert out.returncode == 1
    assert "+        losses.append(loss.item())  # expect: TGL101" in out.stdout
    assert target.read_text() == FIXTURE.read_text()
