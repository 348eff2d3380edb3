#!/usr/bin/env python
"""Benchmark torchgradlint against flake8, a LibCST parse-only floor, ruff and
TorchFix on real PyTorch code (the corpus of ``realcode/packages.toml``,
downloaded into ``.cache/realcode/`` by ``realcode/lint_real.py``'s helpers).

Every tool gets the same explicit list of files on its command line, so file
discovery is not part of the figures. Each tool runs once per round, the
tools interleaved and their order rotated from round to round; the report
shows medians over the rounds.

Usage::

    pip install -r bench/requirements.txt
    python bench/bench.py                        # 3 rounds over the realcode corpus
    python bench/bench.py --rounds 5 --json out.json
    python bench/bench.py --setup                # first: create the peers' venvs in .cache/bench/

Measured per tool: wall seconds (median), files/s, lines/s and peak RSS
(``os.wait4``'s rusage of the tool's process, which covers the descendants it
waited for: the largest single process, e.g. one pool worker, not a sum).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "realcode"))
import lint_real  # noqa: E402  (realcode/lint_real.py: download, extract, file lists)

BENCH_DIR = ROOT / ".cache" / "bench"

# LibCST parse-only floor: parse, in one process, every file of the list
# (the files that reach torchgradlint's parser: both prefilter stages pass).
PARSE_FLOOR = r"""
import sys, libcst
n = 0
for path in open(sys.argv[1]).read().splitlines():
    with open(path, "rb") as fh:
        data = fh.read()
    try:
        libcst.parse_module(data)
        n += 1
    except Exception:
        pass
print(n, file=sys.stderr)
"""


def _flake8_pin() -> str:
    """``flake8==<the version installed here>`` (bench/requirements.txt pins it)."""
    from importlib.metadata import version

    return f"flake8=={version('flake8')}"


def _peers() -> dict[str, list[list[str]]]:
    """Peer tool -> pip install steps of its venv (``<tool>-venv/bin/<tool>``)."""
    return {"torchfix": [["torch==2.13.0"], ["torchfix==0.7.0", _flake8_pin()]],
            "flake8": [[_flake8_pin()]]}


def setup_venvs(bench_dir: Path = BENCH_DIR) -> None:
    """Create the peers' virtual environments under ``bench_dir``, each only
    if missing:

    - ``torchfix-venv``: torch==2.13.0 first (the CPU wheel; any other torch
      requirement pulls CUDA packages), then torchfix==0.7.0 and flake8;
    - ``flake8-venv``: flake8 alone (same version as here), to time
      ``flake8 --select F`` without torchgradlint installed.

    Raises:
        subprocess.CalledProcessError: venv creation or pip failed.
    """
    for peer, steps in _peers().items():
        venv = bench_dir / f"{peer}-venv"
        if (venv / "bin" / peer).exists():
            continue
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
        for reqs in steps:
            subprocess.run(pip + reqs, check=True)


def corpus(packages: Path, cache: Path, only: Optional[list[str]] = None) -> tuple[list[str], int]:
    """Absolute paths of every ``*.py`` of the pinned packages (all, or those
    named in ``only``), and their lines. A package that can no longer be
    downloaded (a pin the index dropped) is left out with a warning."""
    files = []
    for pkg in lint_real.load_packages(packages):
        if only and pkg.name not in only:
            continue
        try:
            root = lint_real.extract(pkg, lint_real.download(pkg, cache), cache)
        except RuntimeError as exc:
            print(f"bench: {pkg.name}=={pkg.version} left out: {str(exc).splitlines()[0]}", file=sys.stderr)
            continue
        files += [str(root / f) for f in lint_real.python_files(root)]
    lines = sum(Path(f).read_bytes().count(b"\n") for f in files)
    return files, lines


def _script(name: str) -> str:
    """The console script ``name`` of this interpreter's environment (what a
    user of that environment runs), not a wrapper found first on ``PATH``
    (pyenv's shims add about 0.25 s of bash and ``pyenv exec`` per run)."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def _tgl_flags() -> list[str]:
    """``--no-cache`` when the installed CLI has a result cache (timings must
    measure linting, not cache hits)."""
    help_text = subprocess.run([_script("torchgradlint"), "check", "--help"], capture_output=True, text=True).stdout
    return ["--no-cache"] if "--no-cache" in help_text else []


def tools(reach_file: Path, files: list[str], venvs: dict[str, Path]) -> dict[str, list[str]]:
    """Name -> command line. The file list is passed as arguments; the parse
    floor reads ``reach_file`` (the files that reach the parser). ``venvs``
    maps ``"torchfix"`` / ``"flake8"`` to the peers' venvs that exist."""
    tgl = _script("torchgradlint")
    flake8 = [_script("flake8"), "--isolated"]
    no_cache = _tgl_flags()
    cmds = {
        "tgl check": [tgl, "check", "--exit-zero", "-q", *no_cache, *files],
        "tgl check --jobs 1": [tgl, "check", "--exit-zero", "-q", "--jobs", "1", *no_cache, *files],
        "flake8 --select TGL": [*flake8, "--exit-zero", "--select", "TGL", *files],
        "flake8 --select F": [*flake8, "--exit-zero", "--select", "F", *files],
        "flake8 --select F,TGL": [*flake8, "--exit-zero", "--select", "F,TGL", *files],
        "libcst parse floor": [sys.executable, "-c", PARSE_FLOOR, str(reach_file)],
    }
    if "flake8" in venvs:
        cmds["flake8 --select F (no torchgradlint)"] = [str(venvs["flake8"] / "bin" / "flake8"), "--isolated",
                                                        "--exit-zero", "--select", "F", *files]
    ruff = shutil.which(_script("ruff"))  # None when ruff is not installed
    if ruff:
        cmds["ruff --select ALL"] = [ruff, "check", "--isolated", "--no-cache", "--exit-zero", "-q",
                                     "--select", "ALL", *files]
    if "torchfix" in venvs:
        b = venvs["torchfix"] / "bin"
        cmds["torchfix --select ALL"] = [str(b / "torchfix"), "--select", "ALL", *files]
        cmds["flake8 --select TOR (torchfix venv)"] = [str(b / "flake8"), "--isolated", "--exit-zero",
                                                       "--select", "TOR", *files]
        cmds["flake8 --select F (torchfix venv)"] = [str(b / "flake8"), "--isolated", "--exit-zero",
                                                     "--select", "F", *files]
    return cmds


def measure(cmd: list[str], timeout: float) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds (user + system, the process and the
    children it waited for), peak RSS in KiB, exit status) of one run of
    ``cmd``."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = t0 + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.perf_counter() > deadline:
            p.kill()
            pid, status, ru = os.wait4(p.pid, 0)
            break
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss, p.returncode


def machine() -> str:
    """One line describing the machine: CPU model, usable cores, Python."""
    model = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{model or platform.processor()}, {cores} usable cores, Python {platform.python_version()}, "
            f"{platform.system()} {platform.release()}, load average {load:.1f} at start")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Benchmark torchgradlint on real PyTorch code.")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--packages", type=Path, default=lint_real.PACKAGES, help="pinned package list (TOML)")
    ap.add_argument("--cache-dir", type=Path, default=lint_real.DEFAULT_CACHE)
    ap.add_argument("--only", action="append", default=[], help="run only tools whose name contains this")
    ap.add_argument("--package", action="append", default=[], help="benchmark only this package (repeatable)")
    ap.add_argument("--setup", "--setup-torchfix", action="store_true",
                    help="create the peers' venvs (TorchFix; flake8 without torchgradlint) if missing")
    ap.add_argument("--bench-dir", type=Path, default=BENCH_DIR, help="where the venvs and file lists live")
    ap.add_argument("--no-torchfix", action="store_true")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per tool run")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    args = ap.parse_args(argv)

    files, lines = corpus(args.packages, args.cache_dir, args.package)
    args.bench_dir.mkdir(parents=True, exist_ok=True)
    reach_files = [f for f in files if lint_real.reaches_parser(Path(f).read_bytes())]
    reach_file = args.bench_dir / "reach.txt"
    reach_file.write_text("\n".join(reach_files) + "\n")
    reach = len(reach_files)

    if args.setup:
        try:
            setup_venvs(args.bench_dir)
        except subprocess.CalledProcessError as exc:
            print(f"note: a peer venv could not be set up: {exc}")
    venvs: dict[str, Path] = {}
    for peer in _peers():
        if peer == "torchfix" and args.no_torchfix:
            continue
        venv = args.bench_dir / f"{peer}-venv"
        if (venv / "bin" / peer).exists():
            venvs[peer] = venv
        else:
            print(f"note: skipped the tools of {venv} (missing; run with --setup)")

    cmds = tools(reach_file, files, venvs)
    if args.only:
        cmds = {k: v for k, v in cmds.items() if any(o in k for o in args.only)}
    print(f"machine: {machine()}")
    print(f"corpus: {len(files)} files, {lines} lines, {reach} files reach the parser; "
          f"{args.rounds} rounds, median")
    walls: dict[str, list[float]] = {k: [] for k in cmds}
    cpus: dict[str, list[float]] = {k: [] for k in cmds}
    rss: dict[str, int] = {k: 0 for k in cmds}
    rcs: dict[str, set] = {k: set() for k in cmds}
    order = list(cmds)
    for r in range(args.rounds):
        # rotate the order each round, so that no tool always runs right
        # after the same (heavy) neighbour
        for name in order[r % len(order):] + order[:r % len(order)]:
            cmd = cmds[name]
            wall, cpu, peak, rc = measure(cmd, args.timeout)
            walls[name].append(wall)
            cpus[name].append(cpu)
            rss[name] = max(rss[name], peak)
            rcs[name].add(rc)
            print(f"    {name}: {wall:.2f} s, cpu {cpu:.2f} s, {peak / 1024:.0f} MiB, exit {rc}", file=sys.stderr,
                  flush=True)
        print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)

    med = {k: statistics.median(v) for k, v in walls.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpus.items()}
    print(f"\n{'tool':<36}{'wall s':>9}{'min':>8}{'max':>8}{'cpu s':>8}{'files/s':>10}{'lines/s':>11}"
          f"{'peak RSS MiB':>14}  exit")
    for k in cmds:
        print(f"{k:<36}{med[k]:>9.2f}{min(walls[k]):>8.2f}{max(walls[k]):>8.2f}{cpu_med[k]:>8.2f}"
              f"{len(files) / med[k]:>10.0f}{lines / med[k]:>11.0f}{rss[k] / 1024:>14.0f}  "
              f"{','.join(map(str, sorted(rcs[k])))}")

    names = list(cmds)
    print("\nratios of median wall time (row / column; < 1 means the row is faster):")
    short = [f"[{i}]" for i in range(len(names))]
    for i, n in enumerate(names):
        print(f"  [{i}] {n}")
    print(" " * 6 + "".join(f"{s:>8}" for s in short))
    for i, a in enumerate(names):
        print(f"{short[i]:>6}" + "".join(f"{med[a] / med[b]:>8.2f}" for b in names))

    def ratio(a: str, b: str) -> Optional[float]:
        return med[a] / med[b] if a in med and b in med else None

    print("\ntargets (issue 5):")
    checks = [
        ("tgl check <= flake8 --select F", ratio("tgl check", "flake8 --select F"), 1.0),
        ("torchfix CLI / tgl check >= 10", (1 / ratio("tgl check", "torchfix --select ALL"))
         if ratio("tgl check", "torchfix --select ALL") else None, None),
        ("flake8 F,TGL / flake8 F <= 1.5", ratio("flake8 --select F,TGL", "flake8 --select F"), 1.5),
        ("tgl --jobs 1 / parse floor <= 1.5", ratio("tgl check --jobs 1", "libcst parse floor"), 1.5),
        ("flake8 F / flake8 F without torchgradlint (no TGL selected)",
         ratio("flake8 --select F", "flake8 --select F (no torchgradlint)"), None),
    ]
    for label, value, limit in checks:
        if value is None:
            print(f"  {label}: n/a")
        elif label.startswith("flake8 F / "):
            print(f"  {label}: {value:.2f}  (run-to-run spread of flake8 F: "
                  f"{min(walls['flake8 --select F']):.2f}-{max(walls['flake8 --select F']):.2f} s)")
        elif limit is None:
            print(f"  {label}: {value:.1f}  {'met' if value >= 10 else 'NOT met'}")
        else:
            print(f"  {label}: {value:.2f}  {'met' if value <= limit else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "files": len(files), "lines": lines,
                                         "reach_parser": reach, "walls": walls, "cpu": cpus, "peak_rss_kib": rss,
                                         "exit": {k: sorted(v) for k, v in rcs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
