"""``torchgradlint run``: the harness's probes on the user's own training (imports torch).

``torchgradlint run train.py [args...]`` / ``torchgradlint run -m package.module [args...]``
runs the script as ``python`` would (``runpy``, ``sys.argv`` set, ``__name__ ==
"__main__"``) with the selected probes installed, then reports each measured defect as
a :class:`~torchgradlint.diagnostics.Diagnostic` at the user's source line that caused
it, in the output formats of ``check``. :func:`watch` does the same around a block of
code or a function (notebooks, callbacks).

Probes never change the program's results: they only read tensors (hooks return
``None``, saved tensors are handed back unchanged, no gradient is copied).

Exit status of ``run``: 0 no defect measured, 1 defects measured, 2 usage error or the
script failed (its traceback is printed; defects measured before are still reported).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import runpy
import sys
import time
import traceback
from typing import Any, Callable, Optional, Sequence, TextIO

import torch

from ..diagnostics import Diagnostic
from . import instrument
from .interrupts import deliver_interrupts
from .probe_map import probes_for, rule_probes
from .probe_registry import all_probes
from .probes import Measurement, Probe, RetainedGraphProbe

EXIT_CLEAN, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2

#: the five core rules (``--probes`` takes codes: ``--probes TGL001,TGL101``)
CORE_RULES = ["TGL001", "TGL002", "TGL101", "TGL102", "TGL201"]

#: backward calls at which ``run`` samples graphs (2, 4, 8, ...): a few samples per run
FIRST_CHECKPOINT = 2
#: checkpoints a growth fit needs: three (2, 4 and 8 backward calls), so that a value rising during the
#: first iterations and then level is told from growth
MIN_CHECKPOINTS = 3


class Session:
    """Probes installed around a stretch of the user's program.

    ``probes``: probe names (default: all). Use as a context manager; then
    :meth:`measurements` and :meth:`diagnostics`.

    Raises:
        KeyError: an unknown probe name.
    """

    def __init__(self, probes: Optional[Sequence[str]] = None) -> None:
        known = all_probes()
        names = list(probes) if probes else probes_for()
        unknown = [n for n in names if n not in known]
        if unknown:
            raise KeyError(f"unknown probe(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        self.probes: dict[str, Probe] = {}
        for name in names:
            self.probes[name] = RetainedGraphProbe(full_scan=False) if name == RetainedGraphProbe.name \
                else known[name]()
        self.samples: dict[int, dict] = {}
        self.backward_calls = 0
        #: a program with no backward (an evaluation script) is sampled at its top-level forwards instead
        self.forward_samples: dict[int, dict] = {}
        self.forward_calls = 0
        self._forward_depth = 0
        self._next_forward = FIRST_CHECKPOINT
        self._forward_hooks: list = []
        self._outside: set[int] = set()
        #: ``(path, line)``: the outermost line of the user's code seen at the first backward or forward (the
        #: script's call into its training); where a finding without any line of its own is reported
        self.entry: Optional[tuple[str, int]] = None
        self.device = "cuda" if torch.cuda.is_available() and torch.cuda.is_initialized() else "cpu"
        self.claimed: Optional[BaseException] = None
        self._next = FIRST_CHECKPOINT
        self._stack: Optional[contextlib.ExitStack] = None
        self._t0 = 0.0
        #: where a defect no probe could attribute to a line is reported (the script; default ``sys.argv[0]``)
        self.program: Optional[str] = None

    # lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> "Session":
        instrument.install()
        f, self._outside = sys._getframe(1), set()
        while f is not None:  # the frames that entered the session: alive until it ends
            self._outside.add(id(f))
            f = f.f_back
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(deliver_interrupts())  # first in, last out: covers the probes' removal too
        for probe in self.probes.values():
            self._stack.enter_context(probe.observe(self.device))
        instrument.LISTENERS.append(self)
        self._stack.callback(instrument.LISTENERS.remove, self)
        # top-level forwards until the first backward: the entry line, and growth checkpoints of a program
        # that never calls backward
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._forward_hooks = [register_module_forward_pre_hook(self._pre_forward),
                               register_module_forward_hook(self._post_forward, always_call=True)]
        self._stack.callback(self._remove_forward_hooks)
        self._t0 = time.perf_counter()
        return self

    def _remove_forward_hooks(self) -> None:
        for handle in self._forward_hooks:
            handle.remove()
        self._forward_hooks = []

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc is not None:
            for probe in self.probes.values():
                if probe.on_exception(exc):
                    self.claimed = exc
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    # checkpoints ---------------------------------------------------------------------------------
    def _note_entry(self, frame: Any) -> None:
        """The outermost user frame below the one that entered the session (not ``run``'s launcher)."""
        outer = None
        f = frame
        while f is not None and id(f) not in self._outside:
            if instrument.is_user_file(f.f_code.co_filename):
                outer = f
            f = f.f_back
        if outer is not None:
            self.entry = instrument.user_stack(limit=1, frame=outer)[0]

    def on_backward_begin(self, kind: str, roots: tuple, retain: bool, create_graph: bool) -> None:
        self.backward_calls += 1
        if self._forward_hooks:  # training: backward calls are the steps; forwards need no watching
            if self.entry is None:
                self._note_entry(sys._getframe(1))
            self._remove_forward_hooks()
        if self.backward_calls >= self._next:
            self._next *= 2
            self.checkpoint(instrument.user_frames(frame=sys._getframe(1)))

    def _pre_forward(self, module: Any, args: Any) -> None:
        self._forward_depth += 1
        if self._forward_depth == 1:  # a top-level module call (the model, not its layers)
            if self.entry is None:
                self._note_entry(sys._getframe(1))
            self.forward_calls += 1
            if self.forward_calls >= self._next_forward:
                self._next_forward *= 2
                self.checkpoint(instrument.user_frames(frame=sys._getframe(1)), self.forward_samples,
                                self.forward_calls)
        return None

    def _post_forward(self, module: Any, args: Any, output: Any) -> None:
        self._forward_depth = max(0, self._forward_depth - 1)
        return None

    def checkpoint(self, frames: Sequence[Any], into: Optional[dict] = None, key: Optional[int] = None) -> None:
        """Sample the retained-graph probe now, into ``into`` (default :attr:`samples`) keyed by ``key``
        (default: the backward calls so far)."""
        probe = self.probes.get(RetainedGraphProbe.name)
        if not isinstance(probe, RetainedGraphProbe):
            return
        sample = probe.checkpoint(frames)
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # the program uses the GPU
            torch.cuda.synchronize()
            sample["cuda_allocated"] = int(torch.cuda.memory_allocated())
            sample["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated())
        sample["seconds"] = round(time.perf_counter() - self._t0, 4)
        (self.samples if into is None else into)[self.backward_calls if key is None else key] = sample

    # results -------------------------------------------------------------------------------------
    def growth_samples(self) -> Optional[dict[int, dict]]:
        """The retained-graph checkpoints to fit growth on: by backward call, else (a program without
        backward) by top-level forward; ``None`` with fewer than :data:`MIN_CHECKPOINTS`."""
        for samples in (self.samples, self.forward_samples):
            if len(samples) >= MIN_CHECKPOINTS:
                return samples
        return None

    def measurements(self) -> list[Measurement]:
        """Each probe's measurement; the retained-graph probe's needs :data:`MIN_CHECKPOINTS` checkpoints."""
        out = []
        for name, probe in self.probes.items():
            if isinstance(probe, RetainedGraphProbe):
                samples = self.growth_samples()
                if probe.stale:  # a retained graph backpropagated after a step changed its weights: no growth fit
                    out.append(probe.judge({self.backward_calls: {"stale": list(probe.stale)}}))
                elif samples is not None:
                    out.append(probe.judge(samples))
            else:
                out.append(type(probe).judge({1: probe.collect()}))
        return out

    def notes(self) -> list[str]:
        """What could not be measured, for the user."""
        probe = self.probes.get(RetainedGraphProbe.name)
        if isinstance(probe, RetainedGraphProbe) and not probe.stale and self.growth_samples() is None:
            need = FIRST_CHECKPOINT * 2 ** (MIN_CHECKPOINTS - 1)
            return [f"retained-graph: {self.backward_calls} backward call(s), {self.forward_calls} top-level "
                    f"forward(s); growth needs {MIN_CHECKPOINTS} checkpoints (at least {need} backward calls, or "
                    f"{need} model calls in a program without backward): TGL101/TGL102 not measured"]
        return []

    def diagnostics(self, confirm: bool = True) -> list[Diagnostic]:
        """One diagnostic per measured finding, at the user's line; ``confirm`` compares with ``check``."""
        findings = [f for m in self.measurements() for f in m.findings]
        static = _static_findings({p for f in findings for p, _ in f["stack"]}) if confirm else None
        # findings of one code that land on one line (an optimizer's parameter groups stepped by one
        # ``step()``) are one diagnostic whose message gives each figure
        by_line: dict[tuple, list[dict]] = {}
        for f in findings:
            d = to_diagnostic(f, static, self.program, self.entry)
            by_line.setdefault((d.code, d.path, d.line), []).append(f)
        out = []
        for group in by_line.values():
            displays = list(dict.fromkeys(f["display"] for f in group))
            merged = group[0] if len(displays) == 1 else {**group[0], "display": "; ".join(displays)}
            out.append(to_diagnostic(merged, static, self.program, self.entry))
        return sorted(out, key=lambda d: d.sort_key)


def _static_findings(paths: set) -> dict[str, set]:
    """``{path: {(code, line), ...}}`` from the static linter on each file (unreadable files: empty)."""
    from ..engine import lint_file
    from ..registry import all_rules

    out: dict[str, set] = {}
    rules = all_rules()
    for path in sorted(paths):
        if not os.path.isfile(path):
            continue
        out[path] = {(d.code, d.line) for d in lint_file(path, rules).diagnostics}
    return out


def _installed(path: str) -> bool:
    parts = path.replace("\\", "/").split("/")
    return "site-packages" in parts or "dist-packages" in parts


def _display_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # pragma: no cover - another drive on Windows
        return path
    return path if rel.startswith("..") else rel


def _span(path: str, line: int) -> tuple[int, int]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for i, text in enumerate(fh, start=1):
                if i == line:
                    text = text.rstrip("\n")
                    return len(text) - len(text.lstrip()) + 1, len(text.rstrip()) + 1
    except OSError:
        pass
    return 1, 1


def to_diagnostic(finding: dict, static: Optional[dict[str, set]], program: Optional[str] = None,
                  entry: Optional[tuple[str, int]] = None) -> Diagnostic:
    """A measured finding as a diagnostic at the line that caused it.

    The line is the frame of the finding's stack that the static linter flags with the same
    code (then the message says the static finding was confirmed), else the first frame
    outside installed packages. A finding without a stack (the probe saw the defect where
    no line of the user's code was running) is reported at ``entry``, the outermost line of
    the user's code seen when the program first ran a model or a backward, else at the first
    statement of ``program`` (default ``sys.argv[0]``), and its message says that no line was
    attributed: never at a line 1 that holds no code.
    """
    code = finding["code"]
    stack = [(p, int(line)) for p, line in finding["stack"]]
    from ..registry import get_rule

    name = get_rule(code).name
    confirmed = None
    if static is not None:
        confirmed = next(((p, line) for p, line in stack if (code, line) in static.get(p, set())), None)
    if confirmed:
        path, line = confirmed
        note = "confirms the static finding"
    elif stack:
        # the first frame outside installed packages (a library's frame is rarely the line to fix)
        path, line = next(((p, ln) for p, ln in stack if not _installed(p)), stack[0])
        note = "not reported by `torchgradlint check`" if static is not None else ""
    else:
        if entry is not None:
            path, line = entry
            where = "reported at the program's first line that ran a model or backward"
        else:
            path = program or (sys.argv[0] if sys.argv and sys.argv[0] else "<run>")
            line = first_statement(path)
            where = "reported at the program's first statement"
        note = f"no line attributed: the probe saw no line of your code; {where}"
    col, end_col = _span(path, line)
    message = f"{name}: measured at run time: {finding['display']}" + (f" ({note})" if note else "")
    return Diagnostic(code, message, _display_path(path), line, col, line, end_col)


def first_statement(path: str) -> int:
    """Line of the first statement of the Python file ``path`` after its docstring (1 if unreadable)."""
    import ast

    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            body = ast.parse(fh.read()).body
    except (OSError, SyntaxError, ValueError):
        return 1
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str) and len(body) > 1:
        body = body[1:]
    return body[0].lineno if body else 1


def render(diagnostics: Sequence[Diagnostic], fmt: str) -> str:
    """Render with a ``check`` output format (concise, full, json, json-lines, github, sarif, junit).

    Raises:
        KeyError: unknown format.
    """
    from ..cli import _read_sources
    from ..output import RenderContext, renderer

    ctx = RenderContext()
    paths = sorted({d.path for d in diagnostics})
    _read_sources(ctx, set(paths))
    ctx.paths = paths
    ctx.files_checked = len(paths)
    return renderer(fmt)(list(diagnostics), ctx)


# --------------------------------------------------------------------------------------------------
# watch(): a context manager / decorator
# --------------------------------------------------------------------------------------------------


class watch(contextlib.ContextDecorator):  # noqa: N801 - used like a function: torchgradlint.watch()
    """Measure the probes' defects in a block or function: ``with torchgradlint.watch(): ...``.

    ``probes``: probe names or rule codes (default: all); ``output_format``: a ``check``
    output format; ``stream``: where the report is written at the end (default
    ``sys.stderr``; ``None`` with ``report=False`` writes nothing). After the block,
    :attr:`diagnostics` holds the measured findings. Exceptions raised in the block
    propagate unchanged.
    """

    def __init__(self, probes: Optional[Sequence[str]] = None, *, output_format: str = "concise",
                 stream: Optional[TextIO] = None, report: bool = True, confirm: bool = True) -> None:
        self.probe_names = resolve_probes(probes)
        self.output_format = output_format
        self.stream = stream
        self.report = report
        self.confirm = confirm
        self.session: Optional[Session] = None
        self.diagnostics: list[Diagnostic] = []

    def _recreate_cm(self) -> "watch":
        return watch(self.probe_names, output_format=self.output_format, stream=self.stream, report=self.report,
                     confirm=self.confirm)

    def __enter__(self) -> "watch":
        self.session = Session(self.probe_names).__enter__()
        here = instrument.user_stack(limit=1, frame=sys._getframe(1))
        self.session.entry = here[0] if here else None  # the block's own line: where a finding without one goes
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        assert self.session is not None
        self.session.checkpoint(instrument.user_frames(frame=sys._getframe(1)))
        self.session.__exit__(exc_type, exc, tb)
        self.diagnostics = self.session.diagnostics(self.confirm)
        if self.report:
            out = self.stream or sys.stderr
            out.write(render(self.diagnostics, self.output_format))
            for note in self.session.notes():
                print(f"torchgradlint: note: {note}", file=out)
        return False


def resolve_probes(selectors: Optional[Sequence[str]]) -> list[str]:
    """Probe names from probe names or rule codes (``["TGL001", "module-mode"]``); default: every rule's probe.

    Raises:
        ValueError: an unknown name or code.
    """
    if not selectors:
        return probes_for()
    known = all_probes()
    out: list[str] = []
    for sel in selectors:
        name = rule_probes().get(sel.upper(), sel)
        if name not in known:
            raise ValueError(f"unknown probe or rule {sel!r}; probes: {', '.join(sorted(known))}; "
                             f"rules: {', '.join(sorted(rule_probes()))}")
        if name not in out:
            out.append(name)
    return out


# --------------------------------------------------------------------------------------------------
# the command
# --------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """Options of ``torchgradlint run`` (the script and its arguments are split off first)."""
    from ..output import FORMAT_NAMES

    p = argparse.ArgumentParser(
        prog="torchgradlint run", usage="torchgradlint run [OPTIONS] (SCRIPT | -m MODULE) [ARGS ...]",
        description="Run a training script under the runtime probes and report measured autograd defects "
                    "with the codes and output formats of 'check'.")
    p.add_argument("--probes", metavar="LIST", default=None,
                   help="comma-separated probes or rule codes (default: all): " + ", ".join(sorted(all_probes())))
    p.add_argument("--output-format", choices=sorted(FORMAT_NAMES), default="concise")
    p.add_argument("--output", metavar="FILE", default=None, help="write the report here instead of stdout")
    p.add_argument("--no-confirm", action="store_true", help="do not run the static check on the reported files")
    p.add_argument("--exit-zero", action="store_true", help="exit 0 even when defects are measured")
    return p


def split_argv(argv: Sequence[str]) -> tuple[list[str], Optional[str], Optional[str], list[str]]:
    """``(our options, script, module, script args)``: options end at ``-m MODULE`` or the first non-option."""
    ours: list[str] = []
    i = 0
    takes_value = {"--probes", "--output-format", "--output"}
    while i < len(argv):
        a = argv[i]
        if a == "-m":
            if i + 1 >= len(argv):
                return ours + [a], None, None, []
            return ours, None, argv[i + 1], list(argv[i + 2:])
        if a == "--":
            i += 1
            break
        if not a.startswith("-") or a == "-":
            break
        ours.append(a)
        if a in takes_value and i + 1 < len(argv):
            ours.append(argv[i + 1])
            i += 1
        i += 1
    if i < len(argv):
        return ours, argv[i], None, list(argv[i + 1:])
    return ours, None, None, []


def _run_program(script: Optional[str], module: Optional[str], args: list[str]) -> Callable[[], Any]:
    def go() -> Any:
        if module is not None:
            sys.argv = [module, *args]
            return runpy.run_module(module, run_name="__main__", alter_sys=True)
        assert script is not None
        sys.argv = [script, *args]
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        return runpy.run_path(script, run_name="__main__")

    return go


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``torchgradlint run``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, script, module, script_args = split_argv(argv)
    parser = build_parser()
    try:
        opts = parser.parse_args(ours)
    except SystemExit as exc:
        return int(exc.code or 0)
    if script is None and module is None:
        print("torchgradlint run: error: name a script or -m MODULE", file=sys.stderr)
        return EXIT_ERROR
    if script is not None and not os.path.isfile(script):
        print(f"torchgradlint run: error: {script}: no such file", file=sys.stderr)
        return EXIT_ERROR
    try:
        names = resolve_probes([s.strip() for s in opts.probes.split(",") if s.strip()] if opts.probes else None)
    except ValueError as exc:
        print(f"torchgradlint run: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    failed = False
    session = Session(names)
    session.program = script if script is not None else module
    try:
        with session:
            _run_program(script, module, script_args)()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            print(f"torchgradlint run: the program exited with status {exc.code}", file=sys.stderr)
            failed = True
    except ImportError as exc:
        if module is not None and getattr(exc, "name", None) == module.split(".")[0]:
            print(f"torchgradlint run: error: no module named {module!r}", file=sys.stderr)
            return EXIT_ERROR
        traceback.print_exc()
        failed = True
    except BaseException as exc:  # noqa: BLE001 - the user's program failed: report it like python
        if isinstance(exc, KeyboardInterrupt):
            print("torchgradlint run: interrupted", file=sys.stderr)
        else:
            traceback.print_exc()
        failed = session.claimed is not exc
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
    sys.stdout.flush()
    diagnostics = session.diagnostics(confirm=not opts.no_confirm)
    text = render(diagnostics, opts.output_format)
    if opts.output:
        with open(opts.output, "w", encoding="utf-8") as fh:
            fh.write(text)
    else:
        sys.stdout.write(text)
    for note in session.notes():
        print(f"torchgradlint run: note: {note}", file=sys.stderr)
    n = len(diagnostics)
    print(f"torchgradlint run: {n} defect{'s' if n != 1 else ''} measured "
          f"(probes: {', '.join(names)}; {session.backward_calls} backward calls).", file=sys.stderr)
    if diagnostics and not opts.exit_zero:
        return EXIT_FINDINGS
    return EXIT_ERROR if failed else EXIT_CLEAN


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
