#!/usr/bin/env python
"""Long fuzzing run of the CLI (the property of ``tests/fuzzing.py``).

Alternates generated programs (hypothesmith, from Python's grammar, behind a
training-loop context) and random mutations of the rule fixtures; prints
every input tried (one line: kind, number, size) and every failure in full,
then a summary. Exit status 1 when anything failed. Failing inputs are kept
under ``--keep`` (default ``.cache/fuzz-failures/``).

Usage::

    python scripts/fuzz.py --seconds 600
    python scripts/fuzz.py --examples 2000 --seed 7
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fuzzing import FIXTURE_TEXTS, TRAINING_CONTEXT, check_text, mutate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--examples", type=int, default=0, help="stop after this many inputs (0: time only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", type=Path, default=ROOT / ".cache" / "fuzz-failures")
    args = parser.parse_args()

    import hypothesmith
    from hypothesis.errors import NonInteractiveExampleWarning

    warnings.simplefilter("ignore", NonInteractiveExampleWarning)
    programs = hypothesmith.from_grammar()
    statements = hypothesmith.from_grammar("single_input")
    rng = random.Random(args.seed)
    deadline = time.monotonic() + args.seconds
    tried = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        while time.monotonic() < deadline and (not args.examples or tried < args.examples):
            tried += 1
            if tried % 2:
                kind, text = "generated", TRAINING_CONTEXT + programs.example()
            else:
                kind, text = "mutated", rng.choice(FIXTURE_TEXTS)
                for _ in range(rng.randint(1, 4)):
                    text = mutate(text, rng, statements.example())
            print(f"{tried:6d} {kind:9s} {len(text):6d} chars", flush=True)
            failure = check_text(text, Path(tmp))
            if failure is not None:
                failed += 1
                args.keep.mkdir(parents=True, exist_ok=True)
                kept = args.keep / f"failure-{args.seed}-{tried}.py"
                kept.write_text(text, encoding="utf-8", errors="surrogatepass")
                print(f"FAILURE ({kept}): {failure}", flush=True)
    print(f"{tried} inputs tried, {failed} failures")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
