"""Command line: ``torchgradlint check | rule | harness``.

Exit status of ``check``: 0 no findings, 1 findings, 2 usage or internal error.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from typing import Optional, Sequence

from . import __version__
from .diagnostics import PARSE_ERROR_CODE
from .engine import lint_bytes
from .files import discover
from .output import FORMATS, RenderContext
from .registry import SelectionError, all_rules, get_rule, select_rules
from .runner import RunResult, default_jobs, lint_paths

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _add_check(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="lint files and directories (default: .)",
                       description="Lint Python files for PyTorch autograd anti-patterns.")
    p.add_argument("paths", nargs="*", default=["."], metavar="PATH",
                   help="files or directories; '-' reads standard input")
    p.add_argument("--select", type=_csv, action="append", metavar="CODES",
                   help="rules to enable, replacing the defaults: codes, prefixes or names, comma separated")
    p.add_argument("--extend-select", type=_csv, action="append", default=[], metavar="CODES",
                   help="rules to enable on top of the selection")
    p.add_argument("--ignore", type=_csv, action="append", default=[], metavar="CODES",
                   help="rules to disable")
    p.add_argument("--output-format", choices=sorted(FORMATS), default="concise")
    p.add_argument("--statistics", action="store_true", help="print counts per rule instead of findings")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    p.add_argument("--stdin-filename", metavar="PATH", help="the name to report for '-' (standard input)")
    p.add_argument("--exclude", type=_csv, action="append", default=[], metavar="PATTERNS",
                   help="gitignore-style patterns of paths to skip")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help=f"worker processes (default: usable cores, here {default_jobs()})")
    p.add_argument("-q", "--quiet", action="store_true", help="print findings only, no summary")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``torchgradlint`` command."""
    parser = argparse.ArgumentParser(
        prog="torchgradlint",
        description="Static analysis for PyTorch autograd anti-patterns.",
    )
    parser.add_argument("--version", action="version", version=f"torchgradlint {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_check(sub)
    r = sub.add_parser("rule", help="explain a rule (code or name), or list all rules")
    r.add_argument("rule", nargs="?", metavar="CODE", help="e.g. TGL001 or missing-zero-grad")
    r.add_argument("--all", action="store_true", help="list every rule")
    h = sub.add_parser("harness", help="run the runtime harness (needs the 'harness' extra: torch)",
                       add_help=False)
    h.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _flatten(groups: Optional[list[list[str]]]) -> Optional[list[str]]:
    if groups is None:
        return None
    return [x for g in groups for x in g]


def _print_statistics(run: RunResult) -> None:
    counts = Counter(d.code for d in run.diagnostics)
    names = {r.code: r.name for r in all_rules()}
    names[PARSE_ERROR_CODE] = "parse-error"
    for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:>6}\t{code}\t{names.get(code, '')}")


def _check(args: argparse.Namespace) -> int:
    try:
        rules = select_rules(_flatten(args.select), _flatten(args.ignore) or (),
                             _flatten(args.extend_select) or ())
    except SelectionError as exc:
        print(f"torchgradlint: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.jobs is not None and args.jobs < 1:
        print("torchgradlint: error: --jobs must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    ctx = RenderContext()
    if args.paths == ["-"]:
        data = sys.stdin.buffer.read()
        name = args.stdin_filename or "-"
        result = lint_bytes(data, name, rules)
        run = RunResult(diagnostics=result.diagnostics, files=1, parsed=int(result.parsed))
        ctx.sources[name] = data.decode("utf-8", errors="replace")
    else:
        if "-" in args.paths:
            print("torchgradlint: error: '-' (standard input) cannot be mixed with paths", file=sys.stderr)
            return EXIT_ERROR
        found = discover(args.paths, exclude=_flatten(args.exclude) or ())
        for err in found.errors:
            print(f"torchgradlint: error: {err}", file=sys.stderr)
        if found.errors and not found.files:
            return EXIT_ERROR
        run = lint_paths(found.files, rules, jobs=args.jobs)
        if args.output_format == "full":
            for path in {d.path for d in run.diagnostics}:
                try:
                    with open(path, encoding="utf-8", errors="replace") as fh:
                        ctx.sources[path] = fh.read()
                except OSError:
                    pass
    ctx.files_checked = run.files
    for err in run.internal_errors:
        print(f"torchgradlint: {err}", file=sys.stderr)
    if args.statistics:
        _print_statistics(run)
    else:
        sys.stdout.write(FORMATS[args.output_format](run.diagnostics, ctx))
    if not args.quiet and args.output_format in ("concise", "full") and not args.statistics:
        n = len(run.diagnostics)
        summary = f"Found {n} finding{'s' if n != 1 else ''} in {run.files} file{'s' if run.files != 1 else ''}."
        print(summary if n else f"All checks passed ({run.files} file{'s' if run.files != 1 else ''}).",
              file=sys.stderr)
    if run.internal_errors:
        return EXIT_ERROR
    if run.diagnostics and not args.exit_zero:
        return EXIT_FINDINGS
    return EXIT_CLEAN


def _rule(args: argparse.Namespace) -> int:
    if args.all or not args.rule:
        for r in all_rules():
            default = "" if r.default_enabled else "  (off by default)"
            print(f"{r.code}  {r.name:<28} {r.summary}{default}")
        return EXIT_CLEAN
    try:
        r = get_rule(args.rule)
    except KeyError:
        print(f"torchgradlint: error: no rule {args.rule!r}; see 'torchgradlint rule --all'", file=sys.stderr)
        return EXIT_ERROR
    print(f"# {r.name} ({r.code})\n")
    print(r.docs.strip())
    return EXIT_CLEAN


def _harness(args: argparse.Namespace) -> int:
    try:
        from .harness.cli import main as harness_main
    except ImportError as exc:  # torch missing
        print(f"torchgradlint: error: the harness needs torch: pip install 'torchgradlint[harness]' ({exc})",
              file=sys.stderr)
        return EXIT_ERROR
    return harness_main(args.args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``torchgradlint`` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        if args.command == "check":
            return _check(args)
        if args.command == "rule":
            return _rule(args)
        return _harness(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_CLEAN


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
