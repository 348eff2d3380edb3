"""Command line: ``torchgradlint check | rule | harness | run``.

Exit status of ``check``: 0 no findings, 1 findings, 2 usage, config or
internal error, or a missing path (the other paths are still linted).

Settings come from the nearest ``pyproject.toml`` with a
``[tool.torchgradlint]`` table (see :mod:`torchgradlint.config`); the
command line's ``--select``/``--extend-select``/``--ignore`` apply on top.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Callable, Optional, Sequence

from . import __version__
from .config import ConfigError, RuleLayer, Settings
from .diagnostics import PARSE_ERROR_CODE, PARSE_ERROR_DOCS, PARSE_ERROR_NAME
from .files import discover
from .output import FORMAT_NAMES, NEEDS_SOURCES, RenderContext, renderer
from .registry import SelectionError, all_rules, check_selectors, get_rule, rule_index
from .runner import RunResult, default_jobs, internal_error, lint_paths, order_key

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _non_negative(kind: type) -> Callable[[str], object]:
    def parse(value: str) -> object:
        try:
            n = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
        if n < 0:
            raise argparse.ArgumentTypeError(f"must be 0 or more: {value!r}")
        return n
    return parse


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
    p.add_argument("--output-format", choices=sorted(FORMAT_NAMES), default="concise")
    p.add_argument("--statistics", action="store_true", help="print counts per rule instead of findings")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when there are findings")
    p.add_argument("--stdin-filename", metavar="PATH",
                   help="the name to report for '-' (standard input); its config and per-file-ignores apply")
    p.add_argument("--exclude", type=_csv, action="append", default=[], metavar="PATTERNS",
                   help="gitignore-style patterns of paths to skip, on top of the config's excludes")
    p.add_argument("--force-exclude", action="store_true",
                   help="apply excludes to files named explicitly too (for pre-commit)")
    p.add_argument("--isolated", action="store_true", help="ignore every pyproject.toml [tool.torchgradlint]")
    p.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help=f"worker processes (default: usable cores, here {default_jobs()})")
    p.add_argument("-q", "--quiet", action="store_true", help="print findings only, no summary")
    p.add_argument("--no-cache", action="store_true",
                   help="neither read nor write the content-hash cache (.torchgradlint_cache)")
    p.add_argument("--cache-dir", metavar="DIR",
                   help="cache folder (default: $TORCHGRADLINT_CACHE_DIR or ./.torchgradlint_cache)")
    p.add_argument("--no-project-index", action="store_true",
                   help="do not resolve classes and decorators imported from the project's other files "
                        "(config: project-index = false)")
    p.add_argument("--fix", action="store_true", help="apply safe fixes in place, then report what remains")
    p.add_argument("--diff", action="store_true",
                   help="print the fixes as a unified diff instead of applying them (exit 1 if any)")
    p.add_argument("--unsafe-fixes", action="store_true", help="also apply fixes marked unsafe")
    p.add_argument("--show-fixes", action="store_true", help="list the fixes applied")
    p.add_argument("--max-file-size", type=_non_negative(int), metavar="BYTES",
                   help="a larger file is reported as one TGL000 and not parsed (0: no limit; default 5 MiB)")
    p.add_argument("--file-timeout", type=_non_negative(float), metavar="SECONDS",
                   help="a file whose lint takes longer is stopped and reported as one TGL000 "
                        "(0: no limit; default 20)")


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
    sub.add_parser("server", help="run the language server (LSP over stdio; needs the 'server' extra: pygls)",
                   description="A Language Server for editors: diagnostics, fixes, noqa actions, rule docs on hover.")
    h = sub.add_parser("harness", help="run the runtime harness (needs the 'harness' extra: torch)",
                       add_help=False)
    h.add_argument("args", nargs=argparse.REMAINDER)
    rn = sub.add_parser("run", help="run a training script under the runtime probes (needs torch)", add_help=False)
    rn.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _flatten(groups: Optional[list[list[str]]]) -> Optional[list[str]]:
    if groups is None:
        return None
    return [x for g in groups for x in g]


PROGRESS_MIN_FILES = 20
"""A run over at least this many files shows a progress bar on a terminal."""


def _stats_rows(run: RunResult) -> list[tuple[str, str, int]]:
    counts = Counter(d.code for d in run.diagnostics)
    names = {r.code: r.name for r in rule_index()}
    names[PARSE_ERROR_CODE] = PARSE_ERROR_NAME
    return [(code, names.get(code, ""), n) for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def _print_statistics(run: RunResult, output_format: str = "concise", unsafe: bool = False) -> None:
    """Counts per rule: with ``--output-format json`` (or ``json-lines``) a
    JSON array of ``{code, name, count, fixable}`` (``fixable``: how many
    ``--fix`` fixes), as ruff prints it; else a rich table on a terminal, else
    plain ``count<TAB>code<TAB>name`` lines."""
    rows = _stats_rows(run)
    if output_format in ("json", "json-lines"):
        import json

        from .output.concise import applies

        fixable = Counter(d.code for d in run.diagnostics if applies(d, unsafe))
        objs = [{"code": code, "name": name, "count": n, "fixable": fixable[code]} for code, name, n in rows]
        if output_format == "json":
            print(json.dumps(objs, indent=2))
        else:
            sys.stdout.write("".join(json.dumps(o) + "\n" for o in objs))
        return
    if sys.stdout.isatty() and rows:
        from rich.console import Console
        from rich.table import Table

        table = Table(title="torchgradlint statistics")
        table.add_column("Code")
        table.add_column("Name")
        table.add_column("Count", justify="right")
        for code, name, n in rows:
            table.add_row(code, name, str(n))
        Console().print(table)
        return
    for code, name, n in rows:
        print(f"{n:>6}\t{code}\t{name}")


class _Progress:
    """A rich progress bar on standard error, or nothing (rich is imported
    only when the bar is shown)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self._bar = None
        self._task = None

    def __enter__(self) -> "Optional[Callable[[], None]]":
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(TextColumn("Linting"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                             console=Console(stderr=True), transient=True)
        self._bar.__enter__()
        self._task = self._bar.add_task("lint", total=self.total)
        return self._advance

    def _advance(self) -> None:
        self._bar.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def show_progress(n_files: int, quiet: bool) -> bool:
    """Whether a run over ``n_files`` files shows a progress bar: only on a
    terminal (standard error is a TTY), not with ``--quiet``, many files."""
    return not quiet and n_files >= PROGRESS_MIN_FILES and sys.stderr.isatty()


def _read_sources(ctx: RenderContext, paths: "set[str]") -> None:
    for path in paths:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                ctx.sources[path] = fh.read()
        except OSError:
            pass


def _check(args: argparse.Namespace) -> int:
    select = _flatten(args.select)
    ignore = _flatten(args.ignore) or []
    extend = _flatten(args.extend_select) or []

    def validate_selectors() -> None:
        check_selectors([*(select or ()), *ignore, *extend])  # raises SelectionError for an unknown selector

    if args.jobs is not None and args.jobs < 1:
        print("torchgradlint: error: --jobs must be at least 1", file=sys.stderr)
        return EXIT_ERROR
    settings = Settings(RuleLayer(tuple(select) if select is not None else None, tuple(extend), tuple(ignore)),
                        isolated=args.isolated, max_file_size=args.max_file_size, file_timeout=args.file_timeout,
                        project_index=not args.no_project_index)
    ctx = RenderContext(unsafe_fixes=args.unsafe_fixes)
    path_errors = False
    try:
        if args.paths == ["-"]:
            validate_selectors()
            data = sys.stdin.buffer.read()
            name = args.stdin_filename or "-"
            where = args.stdin_filename or os.path.join(os.getcwd(), "-")
            run = lint_paths([name], [], jobs=1, codes_for=lambda _: settings.codes_for(where),
                             budget_for=lambda _: settings.budget_for(where), data=data)
            ctx.sources[name] = data.decode("utf-8", errors="replace")
            ctx.paths = [name]
        else:
            if "-" in args.paths:
                print("torchgradlint: error: '-' (standard input) cannot be mixed with paths", file=sys.stderr)
                return EXIT_ERROR
            found = discover(args.paths, exclude=_flatten(args.exclude) or (), settings=settings,
                             force_exclude=args.force_exclude)
            for err in found.errors:
                print(f"torchgradlint: error: {err}", file=sys.stderr)
            for warning in found.warnings:
                print(f"torchgradlint: warning: {warning}", file=sys.stderr)
            path_errors = bool(found.errors)
            with _Progress(len(found.files), show_progress(len(found.files), args.quiet)) as advance:
                cache = None
                if not (args.no_cache or args.fix or args.diff):
                    from .cache import Cache

                    cache = Cache(args.cache_dir) if args.cache_dir else Cache.default()
                from .project_index import indexes_for

                run = lint_paths(found.files, [], jobs=args.jobs, codes_for=settings.codes_for, progress=advance,
                                 cache=cache, selection_for=settings.selection_key,
                                 before_linting=validate_selectors, budget_for=settings.budget_for,
                                 project_for=indexes_for(args.paths, cache, settings.uses_project_index))
            ctx.paths = list(found.files)
            if args.output_format in NEEDS_SOURCES:
                _read_sources(ctx, {d.path for d in run.diagnostics})
    except (ConfigError, SelectionError) as exc:
        print(f"torchgradlint: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    if args.fix or args.diff:
        if args.paths == ["-"]:
            print("torchgradlint: error: --fix and --diff need files, not standard input", file=sys.stderr)
            return EXIT_ERROR
        fixed = _apply_fixes(run, settings, args)
        if args.diff:
            for err in run.internal_errors:
                print(f"torchgradlint: {err}", file=sys.stderr)
            if run.internal_errors or path_errors:
                return EXIT_ERROR
            return EXIT_FINDINGS if fixed else EXIT_CLEAN
    for err in run.internal_errors:
        print(f"torchgradlint: {err}", file=sys.stderr)
    if args.statistics:
        _print_statistics(run, args.output_format, args.unsafe_fixes)
    else:
        sys.stdout.write(renderer(args.output_format)(run.diagnostics, ctx))
    if not args.quiet and args.output_format in ("concise", "full") and not args.statistics:
        print(summary(run, args.unsafe_fixes), file=sys.stderr)
    if run.internal_errors or path_errors:
        return EXIT_ERROR
    if run.diagnostics and not args.exit_zero:
        return EXIT_FINDINGS
    return EXIT_CLEAN


def summary(run: RunResult, unsafe: bool = False) -> str:
    """The closing lines on standard error of a ``concise``/``full`` run.

    The first counts how many files were linted, skipped by the prefilter
    (never parsed: a syntax error there goes unseen) and not parsed (one
    TGL000 each), e.g. ``All checks passed (12 files: 9 linted, 3 skipped by
    the prefilter).``; an internal error is a ``TGL000`` finding, so such a
    run never passes. As ruff words it, a second line counts the findings
    ``--fix`` fixes (``[*] 2 fixable with `--fix`.``) and the unsafe fixes
    that ``--unsafe-fixes`` would add.
    """
    def plural(n: int, word: str, words: str = "") -> str:
        return f"{n} {word if n == 1 else words or word + 's'}"

    parts = [f"{run.linted} linted"]
    if run.skipped:
        parts.append(f"{run.skipped} skipped by the prefilter")
    if run.failed:
        parts.append(f"{run.failed} not parsed")
    files = plural(run.files, "file") + (": " + ", ".join(parts) if len(parts) > 1 else "")
    n = len(run.diagnostics)
    if not n:
        return f"All checks passed ({files})."
    lines = [f"Found {plural(n, 'finding')} in {files}."]
    fixable = sum(d.fix is not None and (d.fix.safe or unsafe) for d in run.diagnostics)
    hidden = sum(d.fix is not None and not d.fix.safe and not unsafe for d in run.diagnostics)
    option = "`--fix --unsafe-fixes`" if unsafe else "`--fix`"
    tail = f" ({plural(hidden, 'hidden fix', 'hidden fixes')} can be enabled with `--unsafe-fixes`)" if hidden else ""
    if fixable:
        lines.append(f"[*] {fixable} fixable with {option}{tail}.")
    elif hidden:
        lines.append(f"No fixes available{tail}.")
    return "\n".join(lines)


def _apply_fixes(run: RunResult, settings: Settings, args: argparse.Namespace) -> int:
    """Fix (or diff) every file with a fixable finding; update ``run`` with
    the findings that remain. Returns the number of fixes applied/proposed."""
    from .fixes import UnfixableFile, fix_file, unified_diff

    fixable = sorted({d.path for d in run.diagnostics if d.fix is not None and (d.fix.safe or args.unsafe_fixes)})
    count = 0
    for path in fixable:
        rules = [get_rule(c) for c in settings.codes_for(path)]
        try:
            outcome = fix_file(path, rules, unsafe=args.unsafe_fixes, write=args.fix and not args.diff)
        except (OSError, UnicodeDecodeError, SyntaxError, UnfixableFile) as exc:
            print(f"torchgradlint: error: {path}: could not fix: {exc}", file=sys.stderr)
            run.internal_errors.append(f"{path}: could not fix")
            continue
        except Exception as exc:  # a bug in a rule met while re-linting the fixed text
            import traceback

            run.internal_errors.append(f"{path}: internal error while fixing (please report):\n"
                                       f"{traceback.format_exc()}")
            run.diagnostics = [d for d in run.diagnostics if d.path != path] + [internal_error(path, exc)]
            continue
        count += len(outcome.applied)
        if args.diff:
            sys.stdout.write(unified_diff(path, outcome.before, outcome.after))
            continue
        run.diagnostics = [d for d in run.diagnostics if d.path != path] + outcome.remaining
        if args.show_fixes:
            for d in outcome.applied:
                print(f"Fixed {d.path}:{d.line}:{d.col}: {d.code}", file=sys.stderr)
    run.diagnostics.sort(key=order_key)
    if args.diff:
        print(f"Would fix {count} finding{'s' if count != 1 else ''}.", file=sys.stderr)
    elif count and not args.quiet:
        print(f"Fixed {count} finding{'s' if count != 1 else ''}.", file=sys.stderr)
    return count


def _rule(args: argparse.Namespace) -> int:
    if args.all or not args.rule:
        for r in all_rules():
            notes = ([] if r.default_enabled else ["off by default"]) + (
                [] if r.fix_availability == "none" else [f"autofix: {r.fix_availability}"])
            print(f"{r.code}  {r.name:<28} {r.summary}" + (f"  ({'; '.join(notes)})" if notes else ""))
        return EXIT_CLEAN
    if args.rule.upper() in (PARSE_ERROR_CODE, PARSE_ERROR_NAME.upper()):
        print(f"# {PARSE_ERROR_NAME} ({PARSE_ERROR_CODE})\n")
        print(PARSE_ERROR_DOCS.strip())
        return EXIT_CLEAN
    try:
        r = get_rule(args.rule)
    except KeyError:
        print(f"torchgradlint: error: no rule {args.rule!r}; see 'torchgradlint rule --all'", file=sys.stderr)
        return EXIT_ERROR
    print(f"# {r.name} ({r.code})\n")
    print(r.docs.strip())
    return EXIT_CLEAN


def _server() -> int:
    try:
        from .server import main as server_main
    except ImportError as exc:  # pygls missing
        print(f"torchgradlint: error: the server needs pygls: pip install 'torchgradlint[server]' ({exc})",
              file=sys.stderr)
        return EXIT_ERROR
    return server_main()


def server_main() -> int:
    """Entry point of the ``torchgradlint-server`` command (``torchgradlint
    server`` for editors whose LSP settings take a program without arguments)."""
    return _server()


def _harness(args: argparse.Namespace) -> int:
    try:
        from .harness.cli import main as harness_main
    except ImportError as exc:  # torch missing
        print(f"torchgradlint: error: the harness needs torch: pip install 'torchgradlint[harness]' ({exc})",
              file=sys.stderr)
        return EXIT_ERROR
    return harness_main(args.args)


def _run(args: list[str]) -> int:
    try:
        from .harness.run import main as run_main
    except ImportError as exc:  # torch missing
        print(f"torchgradlint: error: 'run' needs torch: pip install 'torchgradlint[harness]' ({exc})",
              file=sys.stderr)
        return EXIT_ERROR
    return run_main(args)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``torchgradlint`` command; returns the exit status."""
    raw = list(sys.argv[1:] if argv is None else argv)
    if raw[:1] == ["harness"]:  # argparse's REMAINDER drops leading options: hand them over verbatim
        return _harness(argparse.Namespace(args=raw[1:]))
    if raw[:1] == ["run"]:
        return _run(raw[1:])
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
        if args.command == "server":
            return _server()
        return _harness(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_CLEAN


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
