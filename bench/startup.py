#!/usr/bin/env python
"""What the flake8 plugin adds to a flake8 run (editor start-up cost).

Times, as medians over ``--rounds`` runs (wall clock, each a fresh process,
the two commands interleaved):

1. ``flake8 --select F,TGL FILE`` minus ``flake8 --select F FILE`` on a
   two-line file that never mentions torch (target <= 0.03 s: the plugin must
   import neither the rules nor LibCST for it);
2. the same on a training script (default: ``fixtures/TGL001/bad_basic_loop.py``;
   the floor is ``import libcst`` plus one parse), with ``import libcst``
   timed alone for reference;
3. ``--select F,TGL`` / ``--select F`` over a tree of training code
   (``--tree``; default: ``fixtures/``), flake8's default parallelism, in
   wall time and in CPU time (flake8 and its workers), which a busy machine
   inflates far less; with ``--compare-src DIR`` (the ``src`` folder of
   another version, e.g. ``git archive main src | tar -x -C /tmp/main``)
   that version runs too, alternating with this one, so both ratios come
   from one run.

Usage::

    python bench/startup.py
    python bench/startup.py --rounds 15 --tree path/to/examples
    python bench/startup.py --tree path/to/examples --compare-src /tmp/main/src
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: "dict[str, str] | None" = None, cpu: "list[float] | None" = None) -> float:
    """Wall seconds of ``cmd``; its CPU seconds (with its children's) are appended to ``cpu``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return wall


def flake8(select: str, target: Path) -> list[str]:
    return [sys.executable, "-m", "flake8", "--isolated", f"--select={select}", str(target)]


def pair(target: Path, rounds: int) -> tuple[float, float]:
    """Medians of ``--select F`` and ``--select F,TGL`` on ``target`` (seconds)."""
    f, ftgl = [], []
    for i in range(rounds):
        order = [("F", f), ("F,TGL", ftgl)]
        if i % 2:
            order.reverse()
        for select, into in order:
            into.append(timed(flake8(select, target)))
    return statistics.median(f), statistics.median(ftgl)


def precompile(extra_src: "list[Path]") -> None:
    """Write the bytecode of torchgradlint (this version's and each of
    ``extra_src``'s) as ``pip install`` does, so that no timed process
    compiles the package from source (flake8 and pyflakes come compiled;
    an environment with ``PYTHONDONTWRITEBYTECODE`` set would otherwise
    charge the compilation, about 0.09 s of CPU, to every run)."""
    import compileall

    import torchgradlint

    for folder in [Path(torchgradlint.__file__).parent, *(src / "torchgradlint" for src in extra_src)]:
        compileall.compile_dir(str(folder), quiet=1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--train", type=Path, default=ROOT / "fixtures" / "TGL001" / "bad_basic_loop.py")
    parser.add_argument("--tree", type=Path, default=ROOT / "fixtures")
    parser.add_argument("--compare-src", type=Path, help="src folder of another version to time alongside")
    args = parser.parse_args()
    precompile([args.compare_src] if args.compare_src else [])
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain.py"
        plain.write_text("import os\nprint(os.getcwd())\n")
        f, ftgl = pair(plain, args.rounds)
        print(f"non-torch file: F {f:.3f} s, F,TGL {ftgl:.3f} s, plugin adds {ftgl - f:+.3f} s")
    f, ftgl = pair(args.train, args.rounds)
    imp = statistics.median(timed([sys.executable, "-c", "import libcst"]) for _ in range(args.rounds))
    bare = statistics.median(timed([sys.executable, "-c", "pass"]) for _ in range(args.rounds))
    print(f"training script {args.train.name}: F {f:.3f} s, F,TGL {ftgl:.3f} s, plugin adds {ftgl - f:+.3f} s "
          f"(import libcst alone: {imp - bare:.3f} s)")
    n = sum(1 for _ in args.tree.rglob("*.py"))
    versions = {"this version": None}
    if args.compare_src:
        versions[str(args.compare_src)] = dict(os.environ, PYTHONPATH=str(args.compare_src))
    runs: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for i in range(max(3, args.rounds // 2)):
        for name, env in versions.items():
            for select in (("F", "F,TGL") if i % 2 == 0 else ("F,TGL", "F")):
                wall, cpu = runs.setdefault((name, select), ([], []))
                wall.append(timed(flake8(select, args.tree), env, cpu))
    for name in versions:
        (fw, fc), (gw, gc) = runs[(name, "F")], runs[(name, "F,TGL")]
        f, ftgl, fcpu, gcpu = (statistics.median(x) for x in (fw, gw, fc, gc))
        print(f"tree {args.tree} ({n} files), {name}: F {f:.2f} s, F,TGL {ftgl:.2f} s, ratio {ftgl / f:.2f}x; "
              f"CPU F {fcpu:.2f} s, F,TGL {gcpu:.2f} s, ratio {gcpu / fcpu:.2f}x")
    print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
