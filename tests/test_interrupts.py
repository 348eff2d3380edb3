"""Ctrl-C under the probes: an interrupt that lands in a probe's finaliser is delivered, not dropped.

Found running ``torchgradlint run`` on minimalRL's REINFORCE.py under ``timeout -s INT``: the
SIGINT landed in a saved tensor's ``__del__`` (Python prints "Exception ignored" and drops the
``KeyboardInterrupt`` there) and the training ran on for minutes.
"""

import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

from torchgradlint.harness import interrupts  # noqa: E402
from torchgradlint.harness.probes import _Packed  # noqa: E402


def _packed_that_interrupts() -> _Packed:
    """A saved tensor whose release (run by its ``__del__``) receives a SIGINT, as a Ctrl-C would."""
    return _Packed(torch.zeros(1), 0, lambda *key: signal.raise_signal(signal.SIGINT), (), (), 0)


def _wait(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.005)


def test_an_interrupt_in_a_probe_finaliser_is_lost_under_pythons_own_handler(monkeypatch):
    """The defect itself: without the session's handler, Python drops the interrupt."""
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    packed = _packed_that_interrupts()
    del packed
    _wait(0.2)  # runs to the end: nothing interrupts it
    assert dropped == [KeyboardInterrupt]


def test_an_interrupt_in_a_probe_finaliser_is_raised_once_the_finaliser_returns(monkeypatch):
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_type))
    with interrupts.deliver_interrupts():
        packed = _packed_that_interrupts()
        with pytest.raises(KeyboardInterrupt):
            del packed
            _wait(2.0)
    assert dropped == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_an_interrupt_in_ordinary_code_is_raised_at_once():
    with interrupts.deliver_interrupts():
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            _wait(2.0)
        assert time.monotonic() - start < 1.0


def test_a_program_handler_is_left_alone():
    seen = []

    def mine(signum, frame):
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, mine)
    try:
        with interrupts.deliver_interrupts():
            assert signal.getsignal(signal.SIGINT) is mine
            signal.raise_signal(signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT]


def test_in_no_raise_looks_through_the_callers():
    frames = []

    @interrupts.no_raise
    def finaliser():
        helper()

    def helper():
        frames.append(sys._getframe())

    finaliser()
    helper()
    assert interrupts.in_no_raise(frames[0]) is True
    assert interrupts.in_no_raise(frames[1]) is False
    assert interrupts.in_no_raise(None) is False


@pytest.mark.slow
def test_run_reports_an_interrupted_training_and_what_it_measured(tmp_path):
    """Ctrl-C during ``torchgradlint run``: the run stops, says so, still reports, exits 2."""
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal\n"
        "import torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.01)\n"
        "for step in range(10_000_000):\n"
        "    opt.zero_grad()\n"
        "    loss = model(torch.randn(4, 8)).pow(2).mean()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    if step == 50:\n"
        "        print('ready', flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n")
    proc = subprocess.run([sys.executable, "-m", "torchgradlint", "run", str(script)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert "ready" in proc.stdout
    assert "torchgradlint run: interrupted" in proc.stderr
    assert "0 defects measured" in proc.stderr
    assert proc.returncode == 2
