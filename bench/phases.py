"""Where a lint's time goes, per phase, in one process, on the real-code corpus.

Usage: python bench/phases.py [--limit N] [ROOT]   (default root: .cache/realcode)

Prints, for the files under ROOT: how many the prefilter (text, then Python
``ast`` where a rule asks for it) sends to the parser, and the seconds (and ms
per parsed file) of each phase of ``torchgradlint.engine.lint_source``: read +
prefilter (both stages, all files), LibCST parse (stock and
without re-validation), the analysis traversal, the rules, and positions for
reported nodes. Ratios are against the stock ``libcst.parse_module`` floor.
"""

from __future__ import annotations

import argparse
import glob
import os
import time

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from torchgradlint.analysis import build_model
from torchgradlint.engine import _cyclic_gc_paused, parse_module
from torchgradlint.prefilter import candidate_rules
from torchgradlint.registry import all_rules


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=".cache/realcode")
    ap.add_argument("--limit", type=int, default=0, help="at most this many files (0: all)")
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.root, "**", "*.py"), recursive=True))
    if args.limit:
        files = files[: args.limit]
    rules = all_rules()
    t = time.perf_counter()
    texts = []
    for f in files:
        with open(f, encoding="utf-8", errors="replace") as fh:
            texts.append((f, fh.read()))
    parsed = []
    for f, s in texts:
        with _cyclic_gc_paused():  # as the engine runs it
            active = candidate_rules(s, rules)
        if active:
            parsed.append((f, s, active))
    t_read = time.perf_counter() - t

    # One file at a time through every phase, as the engine does: keeping all
    # trees alive would make the cyclic GC walk an ever larger heap and
    # charge that to whichever phase runs last. The engine's phases run with
    # the collector paused, as in the engine, and the collector resumes only
    # once the file's trees are freed; the floor runs as stock LibCST does.
    times = {"parse": 0.0, "build": 0.0, "pos": 0.0, **{r.code: 0.0 for r in rules}}
    t_floor = 0.0
    found = 0
    for f, s, active in parsed:
        t = time.perf_counter()
        cst.parse_module(s)
        t_floor += time.perf_counter() - t
        with _cyclic_gc_paused():
            found += _engine_phases(f, s, active, rules, times)
    t_parse, t_build, t_pos = times["parse"], times["build"], times["pos"]
    per_rule = {r.code: times[r.code] for r in rules}

    n = max(1, len(parsed))
    lines = sum(s.count("\n") for _, s, _ in parsed)
    print(f"{len(files)} files, {len(parsed)} reach the parser ({lines} lines), {found} findings")
    rows = [("read + prefilter (all files)", t_read), ("libcst.parse_module (floor)", t_floor),
            ("parse without re-validation", t_parse), ("analysis traversal", t_build)]
    rows += [(f"rule {code}", sec) for code, sec in per_rule.items()]
    rows += [("positions (files with findings)", t_pos)]
    total = t_read + t_parse + t_build + sum(per_rule.values()) + t_pos
    print(f"{'phase':<34}{'seconds':>9}{'ms/file':>9}{'x floor':>9}")
    for name, sec in rows:
        print(f"{name:<34}{sec:>9.2f}{1000 * sec / n:>9.2f}{sec / t_floor:>9.2f}")
    print(f"{'total lint':<34}{total:>9.2f}{1000 * total / n:>9.2f}{total / t_floor:>9.2f}")


def _engine_phases(path: str, source: str, active: list, rules: list, times: dict[str, float]) -> int:
    """Run the engine's phases on one file, adding each one's seconds to
    ``times``; returns the number of findings. Its trees die on return."""
    t = time.perf_counter()
    module = parse_module(source)
    times["parse"] += time.perf_counter() - t
    t = time.perf_counter()
    model = build_model(module, source, path)
    times["build"] += time.perf_counter() - t
    hits = []
    for r in rules:
        t = time.perf_counter()
        if r in active:
            hits += list(r().check(model))
        times[r.code] += time.perf_counter() - t
    if hits:
        t = time.perf_counter()
        MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        times["pos"] += time.perf_counter() - t
    return len(hits)


if __name__ == "__main__":
    main()
