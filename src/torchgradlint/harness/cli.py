"""``torchgradlint harness``: run every fixture under torch and pair linter and probe verdicts.

Exit status: 0 every fixture run agrees; 1 a disagreement (named in the report:
fixture, probe, figure) or a failed run; 2 usage error (no fixtures, unknown rule,
``--device cuda`` without a GPU, torch missing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

from .devices import DeviceError, cuda_available, select_devices
from .report import build_report, render
from .runner import rule_probes, run_harness

EXIT_AGREE, EXIT_DISAGREE, EXIT_ERROR = 0, 1, 2


def default_fixtures_dir() -> Path:
    """The fixtures shipped with torchgradlint: ``torchgradlint/fixtures`` in
    an installed wheel (package data, see ``setup.py``), else the repository's
    ``fixtures/`` next to ``src/`` (a source checkout or an editable install).
    A user's own folder is passed with ``--fixtures DIR`` instead."""
    package = Path(__file__).resolve().parents[1]
    shipped = package / "fixtures"
    if shipped.is_dir():
        return shipped
    return package.parents[1] / "fixtures"


def build_parser() -> argparse.ArgumentParser:
    """The ``torchgradlint harness`` argument parser."""
    p = argparse.ArgumentParser(prog="torchgradlint harness",
                                description="Run each fixture under torch with the probe of its rule and "
                                            "check that flagged by the linter <=> defect measured.")
    p.add_argument("--device", choices=("cpu", "cuda", "all"), default="all",
                   help="cpu, cuda, or all (cpu plus cuda when torch.cuda.is_available()); default all")
    p.add_argument("--rule", action="append", default=[], metavar="CODE",
                   help="only these rule directories (repeatable, e.g. --rule TGL101)")
    p.add_argument("--fixtures", type=Path, default=None, metavar="DIR",
                   help="your own folder laid out like fixtures/ (<CODE>/bad_*.py, <CODE>/ok_*.py); "
                        "default: the fixtures shipped with torchgradlint")
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table")
    p.add_argument("--steps", type=int, default=10, metavar="N",
                   help="run each fixture at N and 2N steps, and 4N for retained-graph (10)")
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="seconds per fixture run (120)")
    p.add_argument("-j", "--jobs", type=int, default=2, metavar="N", help="fixtures run in parallel (2)")
    p.add_argument("--output", type=Path, default=None, metavar="FILE", help="write the report here")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def _torch_version() -> str:
    """torch's version; imports torch, without the warning a torch build with
    NumPy support prints on import when NumPy is not installed (the harness
    does not use NumPy).

    Raises:
        ImportError: torch is not installed.
    """
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
        import torch

    return torch.__version__


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``torchgradlint harness``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse: --help exits 0, errors exit 2
        return int(exc.code or 0)
    if args.steps < 1 or args.jobs < 1 or args.timeout <= 0:
        print("torchgradlint harness: error: --steps and --jobs must be >= 1, --timeout > 0", file=sys.stderr)
        return EXIT_ERROR
    try:
        version = _torch_version()
    except ImportError as exc:
        print(f"torchgradlint harness: error: needs torch: pip install 'torchgradlint[harness]' ({exc})",
              file=sys.stderr)
        return EXIT_ERROR
    has_cuda = cuda_available()
    try:
        devices = select_devices(args.device, has_cuda)
    except DeviceError as exc:
        print(f"torchgradlint harness: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    probes = rule_probes()
    unknown = [r for r in args.rule if r.upper() not in probes]
    if unknown:
        print(f"torchgradlint harness: error: no probe for rule(s) {', '.join(unknown)}; "
              f"known: {', '.join(sorted(probes))}", file=sys.stderr)
        return EXIT_ERROR
    fixtures = args.fixtures or default_fixtures_dir()

    def progress(res) -> None:  # type: ignore[no-untyped-def]
        if not args.quiet:
            print(f"  {res.verdict:<8} {res.fixture} [{res.device}] {res.display or res.error or ''}",
                  file=sys.stderr, flush=True)

    try:
        results = run_harness(fixtures, devices, args.rule, args.steps, args.timeout, args.jobs, progress)
    except FileNotFoundError as exc:
        print(f"torchgradlint harness: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if not results:
        print(f"torchgradlint harness: error: no fixtures under {fixtures}", file=sys.stderr)
        return EXIT_ERROR
    note = "not requested" if args.device == "cpu" else "no CUDA device: torch.cuda.is_available() is False"
    if has_cuda and "cuda" not in devices:
        note = "not requested"
    report = build_report(results, devices, note, args.steps, version)
    text = render(report, args.format)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")
        if args.format != "table":
            sys.stdout.write(render(report, "table"))
    else:
        sys.stdout.write(text)
    return EXIT_AGREE if report["agree"] else EXIT_DISAGREE


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
