#!/usr/bin/env python
"""Time ``torchgradlint check`` with the project index on and off, cold and
warm, over whole project folders (issue 11, build items 3 and 6).

Per round, interleaved, for each folder given:

- ``off``: ``--no-project-index --no-cache`` (the index's baseline);
- ``on``: ``--no-cache``: the index is built in memory, every referenced file
  summarised (its cold cost);
- ``on, cold cache``: an empty ``--cache-dir``: the same plus writing the
  result cache and the index's summaries;
- ``on, summaries cached``: the cache of the previous run with its result
  entries removed (``index.json``): every file is linted again, the summaries
  are read from the cache (the index's warm cost);
- ``on, warm cache`` / ``off, warm cache``: an unchanged re-run, answered by
  the result cache (the index adds its dependency checks);
- with ``--flake8``, the yardsticks of issue 5 on the same files:
  ``flake8 --select F`` and ``flake8 --select F,TGL`` (the plugin, which
  uses the index: the summaries are written to a fresh cache folder in the
  first round's run, read in the others').

Prints median wall and CPU seconds per variant and the files the index
summarised. Usage::

    python bench/project_index.py /work/corpora/transformers /work/corpora/pytorch-image-models --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # noqa: E402  (measure, machine, console scripts)


def _summaries(cache: Path) -> int:
    """Files summarised in the cache folder's project index stores."""
    return sum(len(json.loads(p.read_text()).get("files", {})) for p in cache.glob("*/project-*.json"))


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description="Time check with the project index on and off.")
    ap.add_argument("folders", nargs="+", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--flake8", action="store_true", help="also time flake8 --select F and F,TGL")
    args = ap.parse_args(argv)
    tgl = bench._script("torchgradlint")
    print(bench.machine())
    for folder in args.folders:
        folder = folder.resolve()
        times: dict[str, list[tuple[float, float]]] = {}
        summarised = 0
        os.environ["TORCHGRADLINT_CACHE_DIR"] = tempfile.mkdtemp()  # the flake8 plugin's cache folder
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as tmp:
                cache = Path(tmp) / "cache"
                base = [tgl, "check", "--exit-zero", "-q", str(folder)]
                runs = [
                    ("off", [*base, "--no-project-index", "--no-cache"]),
                    ("on", [*base, "--no-cache"]),
                    ("on, cold cache", [*base, "--cache-dir", str(cache)]),
                    ("on, warm cache", [*base, "--cache-dir", str(cache)]),
                    ("on, summaries cached", None),
                    ("off, cold cache", [*base, "--no-project-index", "--cache-dir", str(cache)]),
                    ("off, warm cache", [*base, "--no-project-index", "--cache-dir", str(cache)]),
                ]
                if args.flake8:
                    files = [str(p) for p in sorted(folder.rglob("*.py"))]
                    flake8 = [bench._script("flake8"), "--isolated", "--exit-zero"]
                    runs += [("flake8 --select F", [*flake8, "--select", "F", *files]),
                             ("flake8 --select F,TGL", [*flake8, "--select", "F,TGL", *files])]
                for name, cmd in runs:
                    if cmd is None:  # drop the results, keep the summaries
                        summarised = _summaries(cache)
                        for index in cache.glob("*/index.json"):
                            index.unlink()
                        cmd = [*base, "--cache-dir", str(cache)]
                    wall, cpu, _, rc = bench.measure(cmd, args.timeout)
                    if rc not in (0, 1):
                        print(f"{name}: exit status {rc}", file=sys.stderr)
                    times.setdefault(name, []).append((wall, cpu))
                shutil.rmtree(cache, ignore_errors=True)
        files = sum(1 for _ in folder.rglob("*.py"))
        print(f"\n{folder.name}: {files} Python files, {summarised} summarised by the index, "
              f"{args.rounds} round(s), median")
        print(f"{'variant':<24} {'wall s':>8} {'CPU s':>8}")
        for name, values in times.items():
            print(f"{name:<24} {statistics.median(w for w, _ in values):>8.2f} "
                  f"{statistics.median(c for _, c in values):>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
