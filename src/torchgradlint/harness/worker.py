"""One fixture, one probe, one device: ``python -m torchgradlint.harness.worker``.

Imports the fixture file by path, then calls its ``main(device, steps)`` at each step
count of the probe's schedule (N, 2N; N, 2N, 4N for ``retained-graph``), each run
seeded (``torch.manual_seed``, ``random.seed``) and observed by a fresh probe
instance installed from outside. The result travels over a private channel, never
stdout (which the fixture owns): the runner passes a pipe's write end as
``--result-fd`` and a per-run nonce on standard input; the worker reads the nonce
before the fixture is imported and writes one JSON object holding it::

    {"nonce": ..., "probe": ..., "device": ..., "measurement": {...} | null,
     "error": str | null, "torch": "2.13.0+cpu", "device_name": "...", "seconds": 1.23}

``error`` is set when the fixture could not be imported or ``main`` raised an
exception the probe does not treat as its measured defect. Without ``--result-fd``
the JSON is printed on stdout (for a person running one fixture by hand).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any, Optional, Sequence



def load_fixture(path: Path) -> ModuleType:
    """Import a fixture file by path under a private module name.

    Raises:
        ImportError: the file cannot be loaded.
        AttributeError: it defines no ``main``.
    """
    spec = importlib.util.spec_from_file_location(f"_tgl_fixture_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if not callable(getattr(module, "main", None)):
        raise AttributeError(f"{path}: defines no main(device, steps)")
    return module


def run_once(main: Any, probe: Any, device: str, steps: int, seed: int) -> Optional[str]:
    """Run ``main(device, steps)`` observed by ``probe``; return an error text or ``None``."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
    code = getattr(main, "__code__", None)
    error: Optional[str] = None

    def profiler(frame: Any, event: str, arg: Any) -> None:
        if event == "return" and frame.f_code is code:
            probe.on_main_return(frame)

    with probe.observe(device):
        if probe.needs_frame and code is not None:
            sys.setprofile(profiler)
        try:
            main(device, steps)
        except Exception as exc:  # noqa: BLE001 - the probe decides what an exception means
            if not probe.on_exception(exc):
                error = "".join(traceback.format_exception_only(type(exc), exc)).strip()[:500]
        finally:
            sys.setprofile(None)
    return error


def measure(path: Path, probe_name: str, device: str, steps: int, seed: int = 0) -> dict:
    """Import the fixture, run it at ``steps`` times each multiple of the probe's schedule.

    Returns the JSON-able result described in the module docstring.

    Raises:
        KeyError: unknown probe name.
    """
    import torch

    from .instrument import install
    from .probe_registry import all_probes

    probe_cls = all_probes()[probe_name]
    start = time.perf_counter()
    install()
    out: dict = {"probe": probe_name, "device": device, "measurement": None, "error": None,
                 "torch": torch.__version__, "device_name": device_name(device)}
    try:
        module = load_fixture(path)
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"import failed: {type(exc).__name__}: {exc}"
        out["seconds"] = round(time.perf_counter() - start, 3)
        return out
    samples: dict[int, dict] = {}
    for n in (steps * m for m in probe_cls.schedule):
        probe = probe_cls()
        try:
            err = run_once(module.main, probe, device, n, seed)
        except Exception as exc:  # noqa: BLE001 - e.g. installing a probe on a device that is absent
            err = f"{type(exc).__name__}: {exc}"[:500]
        if err is not None:
            out["error"] = f"main(device={device!r}, steps={n}) raised {err}"
            break
        samples[n] = probe.collect()
    if out["error"] is None:
        out["measurement"] = probe_cls.judge(samples).to_json()
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out


def device_name(device: str) -> str:
    """A short description of ``device`` ("cpu", or the CUDA device's name)."""
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return device


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Worker entry point; prints one result line and returns 0 (2 on bad arguments)."""
    parser = argparse.ArgumentParser(prog="python -m torchgradlint.harness.worker")
    parser.add_argument("--fixture", required=True, type=Path)
    parser.add_argument("--probe", required=True)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--result-fd", type=int, default=None, help="write the result here (a pipe's write end)")
    args = parser.parse_args(argv)
    channel = None
    nonce = ""
    if args.result_fd is not None:
        nonce = sys.stdin.readline().strip()  # before the fixture runs: it never sees the nonce
        channel = os.fdopen(args.result_fd, "w", encoding="utf-8")
        os.set_inheritable(args.result_fd, False)
    result = measure(args.fixture.resolve(), args.probe, args.device, args.steps, args.seed)
    result["nonce"] = nonce
    text = json.dumps(result, sort_keys=True)
    if channel is None:
        print(text, flush=True)
    else:
        channel.write(text)
        channel.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
