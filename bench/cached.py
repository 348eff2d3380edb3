#!/usr/bin/env python
"""Time a re-run of ``torchgradlint check`` over an unchanged tree, answered
from the content-hash cache (issue 5's target: under 0.3 s for 1,000 files).

Copies the first ``--files`` files of the corpus (``realcode/packages.toml``,
sorted by path) into a temporary tree, fills the cache with one cold run, then
per round times, interleaved: the interpreter alone (``python -c pass``, the
floor no Python tool can beat), a re-run over the unchanged tree, and a re-run
after editing ``--edit`` files (a comment appended: those miss, the rest hit).
Prints the medians and the re-run's share above the interpreter.

Usage::

    python bench/cached.py                      # 1,000 files, 7 rounds
    python bench/cached.py --files 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (corpus, measure, machine, console scripts)


def build_tree(files: list[str], tree: Path) -> None:
    """Copy ``files`` into ``tree`` as ``f00000.py``, ``f00001.py``, ..."""
    tree.mkdir(parents=True)
    for i, f in enumerate(files):
        shutil.copyfile(f, tree / f"f{i:05d}.py")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Time cached re-runs of torchgradlint check.")
    ap.add_argument("--files", type=int, default=1000, help="files in the tree (default 1000)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--edit", type=int, default=10, help="files edited before the 'edited' re-run (default 10)")
    ap.add_argument("--packages", type=Path, default=bench.lint_real.PACKAGES, help="pinned package list (TOML)")
    ap.add_argument("--cache-dir", type=Path, default=bench.lint_real.DEFAULT_CACHE,
                    help="where the corpus downloads live")
    args = ap.parse_args(argv)

    files, _ = bench.corpus(args.packages, args.cache_dir)
    files = sorted(files)[: args.files]
    if len(files) < args.files:
        print(f"error: the corpus has only {len(files)} files", file=sys.stderr)
        return 2
    tgl = bench._script("torchgradlint")
    print(bench.machine())
    with tempfile.TemporaryDirectory(prefix="tgl-cached-") as tmp:
        tree, cache = Path(tmp) / "tree", Path(tmp) / "cache"
        build_tree(files, tree)
        run = [tgl, "check", "--exit-zero", "-q", "--cache-dir", str(cache), str(tree)]
        cold, _, _, rc = bench.measure(run, 3600)
        if rc != 0:
            print(f"error: {' '.join(run)} exited with {rc}", file=sys.stderr)
            return 1
        times: dict[str, list[float]] = {"python -c pass": [], "re-run, unchanged": [],
                                         f"re-run, {args.edit} edited": []}
        for r in range(args.rounds):
            times["python -c pass"].append(bench.measure([sys.executable, "-c", "pass"], 60)[0])
            times["re-run, unchanged"].append(bench.measure(run, 600)[0])
            for i in range(args.edit):
                target = tree / f"f{(r * args.edit + i) % len(files):05d}.py"
                target.write_bytes(target.read_bytes() + f"\n# edit {r}\n".encode())
            times[f"re-run, {args.edit} edited"].append(bench.measure(run, 600)[0])
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"{len(files)} files, cold run (fills the cache): {cold:.2f} s; medians of {args.rounds} rounds:")
    for name, t in med.items():
        print(f"  {name:<24} {t:6.3f} s   (min {min(times[name]):.3f}, max {max(times[name]):.3f})")
    print(f"  re-run above the interpreter: {med['re-run, unchanged'] - med['python -c pass']:.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
