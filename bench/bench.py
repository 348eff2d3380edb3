#!/usr/bin/env python
"""Benchmark torchgradlint against flake8, a LibCST parse-only floor, ruff and
TorchFix on real PyTorch code (the corpus of ``realcode/packages.toml``,
downloaded into ``.cache/realcode/`` by ``realcode/lint_real.py``'s helpers).

Every tool gets the same explicit list of files on its command line, so file
discovery is not part of the figures. Each tool runs once per round, the
tools interleaved; the report shows medians over the rounds.

Usage::

    pip install -r bench/requirements.txt
    python bench/bench.py                        # 3 rounds over the realcode corpus
    python bench/bench.py --rounds 5 --json out.json
    python bench/bench.py --setup-torchfix       # create .cache/bench/torchfix-venv first

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

TORCHFIX_VENV = ROOT / ".cache" / "bench" / "torchfix-venv"
HINTS = lint_real.TORCH_HINTS

# LibCST parse-only floor: parse, in one process, every file that contains one
# of the engine's prefilter words (the files that can reach the parser).
PARSE_FLOOR = r"""
import sys, libcst
hints = tuple(sys.argv[1].split(","))
n = 0
for path in open(sys.argv[2]).read().splitlines():
    with open(path, "rb") as fh:
        data = fh.read()
    text = data.decode("utf-8", "replace")
    if any(h in text for h in hints):
        try:
            libcst.parse_module(data)
            n += 1
        except Exception:
            pass
print(n, file=sys.stderr)
"""


def setup_torchfix(venv: Path = TORCHFIX_VENV) -> None:
    """Create the TorchFix virtual environment: torch==2.13.0 first (the CPU
    wheel), then torchfix==0.7.0 and flake8. Raises ``CalledProcessError``."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    subprocess.run(pip + ["torchfix==0.7.0", "flake8"], check=True)


def corpus(packages: Path, cache: Path, only: Optional[list[str]] = None) -> tuple[list[str], int]:
    """Absolute paths of every ``*.py`` of the pinned packages (all, or those
    named in ``only``), and their lines."""
    files = []
    for pkg in lint_real.load_packages(packages):
        if only and pkg.name not in only:
            continue
        root = lint_real.extract(pkg, lint_real.download(pkg, cache), cache)
        files += [str(root / f) for f in lint_real.python_files(root)]
    lines = sum(Path(f).read_bytes().count(b"\n") for f in files)
    return files, lines


def _tgl_flags() -> list[str]:
    """``--no-cache`` when the installed CLI has a result cache (timings must
    measure linting, not cache hits)."""
    help_text = subprocess.run(["torchgradlint", "check", "--help"], capture_output=True, text=True).stdout
    return ["--no-cache"] if "--no-cache" in help_text else []


def tools(list_file: Path, files: list[str], torchfix: Optional[Path]) -> dict[str, list[str]]:
    """Name -> command line. The file list is passed as arguments."""
    tgl = shutil.which("torchgradlint") or "torchgradlint"
    flake8 = [sys.executable, "-m", "flake8", "--isolated"]
    no_cache = _tgl_flags()
    cmds = {
        "tgl check": [tgl, "check", "--exit-zero", "-q", *no_cache, *files],
        "tgl check --jobs 1": [tgl, "check", "--exit-zero", "-q", "--jobs", "1", *no_cache, *files],
        "flake8 --select TGL": [*flake8, "--exit-zero", "--select", "TGL", *files],
        "flake8 --select F": [*flake8, "--exit-zero", "--select", "F", *files],
        "flake8 --select F,TGL": [*flake8, "--exit-zero", "--select", "F,TGL", *files],
        "libcst parse floor": [sys.executable, "-c", PARSE_FLOOR, ",".join(HINTS), str(list_file)],
    }
    ruff = shutil.which("ruff")
    if ruff:
        cmds["ruff --select ALL"] = [ruff, "check", "--isolated", "--no-cache", "--exit-zero", "-q",
                                     "--select", "ALL", *files]
    if torchfix is not None:
        b = torchfix / "bin"
        cmds["torchfix --select ALL"] = [str(b / "torchfix"), "--select", "ALL", *files]
        cmds["flake8 --select TOR (torchfix venv)"] = [str(b / "flake8"), "--isolated", "--exit-zero",
                                                       "--select", "TOR", *files]
        cmds["flake8 --select F (torchfix venv)"] = [str(b / "flake8"), "--isolated", "--exit-zero",
                                                     "--select", "F", *files]
    return cmds


def measure(cmd: list[str], timeout: float) -> tuple[float, int, int]:
    """(wall seconds, peak RSS in KiB, exit status) of one run of ``cmd``."""
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
    return wall, ru.ru_maxrss, p.returncode


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
    ap.add_argument("--setup-torchfix", action="store_true", help="create the TorchFix venv if missing")
    ap.add_argument("--no-torchfix", action="store_true")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per tool run")
    ap.add_argument("--json", type=Path, help="write the raw figures here")
    args = ap.parse_args(argv)

    files, lines = corpus(args.packages, args.cache_dir, args.package)
    list_file = ROOT / ".cache" / "bench" / "files.txt"
    list_file.parent.mkdir(parents=True, exist_ok=True)
    list_file.write_text("\n".join(files) + "\n")
    reach = sum(any(h in Path(f).read_text(encoding="utf-8", errors="replace") for h in HINTS) for f in files)

    torchfix: Optional[Path] = None
    if not args.no_torchfix:
        if not (TORCHFIX_VENV / "bin" / "torchfix").exists() and args.setup_torchfix:
            try:
                setup_torchfix()
            except subprocess.CalledProcessError as exc:
                print(f"note: TorchFix skipped, its venv could not be set up: {exc}")
        if (TORCHFIX_VENV / "bin" / "torchfix").exists():
            torchfix = TORCHFIX_VENV
        else:
            print(f"note: TorchFix skipped: no {TORCHFIX_VENV}/bin/torchfix (run with --setup-torchfix)")

    cmds = tools(list_file, files, torchfix)
    if args.only:
        cmds = {k: v for k, v in cmds.items() if any(o in k for o in args.only)}
    print(f"machine: {machine()}")
    print(f"corpus: {len(files)} files, {lines} lines, {reach} files mention {'/'.join(HINTS)}; "
          f"{args.rounds} rounds, median")
    walls: dict[str, list[float]] = {k: [] for k in cmds}
    rss: dict[str, int] = {k: 0 for k in cmds}
    rcs: dict[str, set] = {k: set() for k in cmds}
    for r in range(args.rounds):
        for name, cmd in cmds.items():
            wall, peak, rc = measure(cmd, args.timeout)
            walls[name].append(wall)
            rss[name] = max(rss[name], peak)
            rcs[name].add(rc)
            print(f"    {name}: {wall:.2f} s, {peak / 1024:.0f} MiB, exit {rc}", file=sys.stderr, flush=True)
        print(f"  round {r + 1}/{args.rounds} done", file=sys.stderr)

    med = {k: statistics.median(v) for k, v in walls.items()}
    print(f"\n{'tool':<36}{'wall s':>9}{'min':>8}{'max':>8}{'files/s':>10}{'lines/s':>11}{'peak RSS MiB':>14}  exit")
    for k in cmds:
        print(f"{k:<36}{med[k]:>9.2f}{min(walls[k]):>8.2f}{max(walls[k]):>8.2f}{len(files) / med[k]:>10.0f}"
              f"{lines / med[k]:>11.0f}{rss[k] / 1024:>14.0f}  {','.join(map(str, sorted(rcs[k])))}")

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
    ]
    for label, value, limit in checks:
        if value is None:
            print(f"  {label}: n/a")
        elif limit is None:
            print(f"  {label}: {value:.1f}  {'met' if value >= 10 else 'NOT met'}")
        else:
            print(f"  {label}: {value:.2f}  {'met' if value <= limit else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "files": len(files), "lines": lines,
                                         "reach_parser": reach, "walls": walls, "peak_rss_kib": rss,
                                         "exit": {k: sorted(v) for k, v in rcs.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
