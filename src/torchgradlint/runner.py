"""Lint many files in supervised worker processes.

Every file is linted in a worker process (one for ``--jobs 1`` or a few
files, up to ``jobs`` for many), never in the command's own process, so that
no file can take the run down with it:

- a worker that dies (a native abort inside LibCST's parser: a 20 MB
  generated file once made it abort with "memory allocation of 128 bytes
  failed" and SIGABRT) costs one ``TGL000`` for the file it was on
  (:func:`~torchgradlint.limits.crash_diagnostic`); a new worker takes over;
- a file whose lint runs past its time budget (``file-timeout``: LibCST's
  native parser takes hours over a 20,000-term ``a + a + ...`` chain, out of
  reach of any in-process alarm) has its worker killed and becomes one
  ``TGL000`` (:func:`~torchgradlint.limits.timeout_diagnostic`);
- a crash inside a rule (a Python exception) is reported per file as an
  internal error, never as a traceback of the run.

The parent imports the engine before it starts workers (``fork`` where the
platform has it, so a worker costs a fork, not a second LibCST import) and
sends one file per message, so it always knows which file a worker is on.
Each file may get its own rule set (from its ``[tool.torchgradlint]``
config) and budget; notebooks (``.ipynb``) go through
:mod:`torchgradlint.notebook`.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import time
import traceback
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from .diagnostics import PARSE_ERROR_CODE, Diagnostic, read_file
from .limits import DEFAULT_BUDGET, Budget, crash_diagnostic, timeout_diagnostic
from .registry import Rule, get_rule

if TYPE_CHECKING:  # pragma: no cover
    from .cache import Cache, EntryKey
    from .incremental import IncrementalParser
    from .project_index import ProjectIndex

# Below this many files one worker does the work: more cost more than they save.
POOL_THRESHOLD = 16


@dataclass
class RunResult:
    """Diagnostics of all files, sorted; internal errors as messages."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    internal_errors: list[str] = field(default_factory=list)
    files: int = 0
    parsed: int = 0

    skipped: int = 0
    """Files the prefilter ruled out (no enabled rule can fire): never parsed,
    so a syntax error in one of them goes unnoticed."""
    failed: int = 0
    """Files reported as one ``TGL000`` (not read, decoded or parsed, or over
    a budget) or as an internal error."""

    def add(self, diagnostics: Sequence[Diagnostic], parsed: bool, internal_error: Optional[str] = None) -> None:
        """Count one file's outcome and keep its diagnostics and internal error."""
        self.diagnostics.extend(diagnostics)
        self.parsed += parsed
        if internal_error:
            self.internal_errors.append(internal_error)
        if internal_error or any(d.code == PARSE_ERROR_CODE for d in diagnostics):
            self.failed += 1
        elif not parsed:
            self.skipped += 1

    @property
    def linted(self) -> int:
        """Files parsed and checked by the rules."""
        return self.files - self.skipped - self.failed


def order_key(d: Diagnostic) -> tuple[str, int, int, int, str]:
    """Output order: path, notebook cell, line, column, code."""
    return (d.path, d.cell or 0, d.line, d.col, d.code)


Outcome = tuple  # (diagnostics, parsed, internal error or None): one file's result


# Per worker process, for a long-lived host: the incremental parser of each
# document linted again after edits, the most recently linted last.
_DOCUMENT_PARSERS: "OrderedDict[str, IncrementalParser]" = OrderedDict()
_DOCUMENTS_KEPT = 8


def _document_parser(path: str) -> "IncrementalParser":
    """The incremental parser of document ``path`` in this process (the
    :data:`_DOCUMENTS_KEPT` most recent documents keep theirs)."""
    from .incremental import IncrementalParser

    parser = _DOCUMENT_PARSERS.pop(path, None) or IncrementalParser()
    _DOCUMENT_PARSERS[path] = parser
    while len(_DOCUMENT_PARSERS) > _DOCUMENTS_KEPT:
        _DOCUMENT_PARSERS.popitem(last=False)
    return parser


def _lint_one(args: tuple) -> Outcome:
    """Worker: ``(path, codes, data or None, budget[, project[, incremental]])``
    -> ``(diagnostics, parsed, internal error[, (deps, summaries)])``.

    ``project`` is ``(root, store or None)`` of the file's project index
    (:func:`torchgradlint.project_index.open_index`, kept per process); the
    outcome then carries the project files the result rests on and the
    summaries this worker made since its last file, for the parent to save.
    ``incremental``: the file is a document a long-lived host lints again
    after each edit; its parse reuses the previous version's unchanged
    top-level statements (:mod:`torchgradlint.incremental`).
    """
    from .engine import lint_data, lint_file

    path, codes, data, budget = args[:4]
    index = None
    if len(args) > 4 and args[4] is not None:
        from .project_index import open_index

        index = open_index(*args[4])
    parser = _document_parser(path) if len(args) > 5 and args[5] and data is not None else None
    rules = [get_rule(c) for c in codes]
    try:
        if data is None:
            result = lint_file(path, rules, budget=budget, project=index)
        else:
            result = lint_data(data, path, rules, budget=budget, project=index, parser=parser)
    except Exception as exc:  # a bug in a rule: report it for this file, keep going
        return ([internal_error(path, exc)], False,
                f"{path}: internal error while linting (please report):\n{traceback.format_exc()}")
    if index is None:
        return result.diagnostics, result.parsed, None
    return result.diagnostics, result.parsed, None, (result.deps, index.drain())


def internal_error(path: str, exc: BaseException) -> Diagnostic:
    """The ``TGL000`` diagnostic of a file whose linting crashed (a bug in
    torchgradlint: the traceback goes to standard error, the run exits 2)."""
    reason = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    return Diagnostic(PARSE_ERROR_CODE, f"internal error, so the file was not linted (please report): {reason}",
                      path, 1, 1, 1, 1)


def _serve(conn: Any) -> None:
    """A worker process's loop: receive ``(index, args)``, send ``(index, outcome)``; ``None`` ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        index, args = message
        conn.send((index, _lint_one(args)))


def _context() -> Any:
    """``fork`` on Linux (a worker inherits the imported engine), else the platform's default."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()  # pragma: no cover - macOS/Windows: spawn


class _Worker:
    """One worker process, its pipe, and the file it is on."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()
        self.index: Optional[int] = None
        self.deadline = float("inf")

    def send(self, index: int, args: tuple, timeout: float) -> None:
        self.conn.send((index, args))
        self.index = index
        self.deadline = time.monotonic() + timeout if timeout > 0 else float("inf")

    def death(self) -> str:
        """How the process ended, in words (after it ended)."""
        self.process.join(1)
        code = self.process.exitcode
        if code is not None and code < 0:
            try:
                return f"signal {signal.Signals(-code).name}"
            except ValueError:
                return f"signal {-code}"
        return f"exit status {code}"

    def stop(self, kill: bool = False) -> None:
        if not kill:
            try:
                self.conn.send(None)
            except OSError:
                kill = True
        if kill or (self.process.join(2) or self.process.exitcode is None):
            self.process.kill()
            self.process.join()
        self.conn.close()


def supervised(work: Sequence[tuple], jobs: int) -> Iterator[tuple[int, Outcome, bool]]:
    """Lint ``work`` (``_lint_one`` argument tuples) in ``jobs`` worker
    processes; yield ``(index into work, outcome, from the worker)`` as files
    finish (``False``: a time-out or crash, which depends on the machine and
    is not cached).

    A worker that dies yields a :func:`~torchgradlint.limits.crash_diagnostic`
    for its file, one that runs past the file's ``budget.file_timeout`` is
    killed and yields a :func:`~torchgradlint.limits.timeout_diagnostic`;
    either is replaced by a fresh worker. Workers are stopped when the
    iterator is closed.
    """
    from multiprocessing.connection import wait

    from . import engine  # noqa: F401  (imported before the fork: workers inherit it)

    ctx = _context()
    # Python's advice before fork: frozen objects (the imported engine) are not
    # walked by the workers' collections, so their pages stay shared, not copied.
    gc.freeze()
    todo = deque(range(len(work)))
    workers: list[_Worker] = []
    try:
        while todo or any(w.index is not None for w in workers):
            for w in workers:
                if w.index is None and todo:
                    i = todo.popleft()
                    w.send(i, work[i], work[i][3].file_timeout)
            while todo and len(workers) < jobs:
                w = _Worker(ctx)
                workers.append(w)
                i = todo.popleft()
                w.send(i, work[i], work[i][3].file_timeout)
            busy = [w for w in workers if w.index is not None]
            wait_for = min(w.deadline for w in busy) - time.monotonic()
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy],
                             timeout=None if wait_for == float("inf") else max(0.0, wait_for)))
            for w in busy:
                i = w.index
                assert i is not None
                path = work[i][0]
                if w.conn in ready or (w.process.sentinel in ready and w.conn.poll()):
                    try:
                        got, outcome = w.conn.recv()
                    except (EOFError, OSError):
                        got, outcome = i, ([crash_diagnostic(path, w.death())], False, None)
                        w.stop(kill=True)
                        workers.remove(w)
                    w.index, w.deadline = None, float("inf")
                    yield got, outcome, got == i and w in workers
                elif w.process.sentinel in ready:
                    yield i, ([crash_diagnostic(path, w.death())], False, None), False
                    w.stop(kill=True)
                    workers.remove(w)
                elif time.monotonic() >= w.deadline:
                    w.stop(kill=True)
                    workers.remove(w)
                    yield i, ([timeout_diagnostic(path, work[i][3])], False, None), False
    finally:
        gc.unfreeze()
        for w in workers:
            w.stop(kill=w.index is not None)


class ResidentWorker:
    """One worker process kept for a long-lived host (the language server):
    each :meth:`lint` sends one file and waits for it under the file's time
    budget; a worker that dies or runs out of time is replaced for the next
    call. Thread-safe (calls are serialised). Workers come from a
    ``forkserver`` (where the platform has one) that has imported the engine,
    so the host's threads are never forked and a replacement starts fast.
    """

    def __init__(self) -> None:
        import threading

        self._lock = threading.Lock()
        self._worker: Optional[_Worker] = None
        self._ctx: Any = None

    def _start(self) -> _Worker:
        if self._ctx is None:
            if "forkserver" in multiprocessing.get_all_start_methods():
                self._ctx = multiprocessing.get_context("forkserver")
                self._ctx.set_forkserver_preload(["torchgradlint.engine", "torchgradlint.runner"])
            else:  # pragma: no cover - Windows: spawn
                self._ctx = multiprocessing.get_context()
        return _Worker(self._ctx)

    def lint(self, path: str, codes: Sequence[str], data: bytes, budget: Budget) -> Outcome:
        """``(diagnostics, parsed, internal error)`` of one file's bytes."""
        from multiprocessing.connection import wait

        with self._lock:
            w = self._worker or self._start()
            self._worker = w
            try:
                w.send(0, (path, tuple(codes), data, budget, None, True), budget.file_timeout)
            except OSError:  # the worker died while idle: start another
                w.stop(kill=True)
                w = self._worker = self._start()
                w.send(0, (path, tuple(codes), data, budget, None, True), budget.file_timeout)
            left = w.deadline - time.monotonic()
            ready = wait([w.conn, w.process.sentinel], timeout=None if left == float("inf") else max(0.0, left))
            if w.conn in ready or (w.process.sentinel in ready and w.conn.poll()):
                try:
                    _, outcome = w.conn.recv()
                    w.index = None
                    return outcome
                except (EOFError, OSError):
                    pass
            self._worker = None
            if w.process.sentinel in ready or not w.process.is_alive():
                outcome = ([crash_diagnostic(path, w.death())], False, None)
            else:
                outcome = ([timeout_diagnostic(path, budget)], False, None)
            w.stop(kill=True)
            return outcome

    def close(self) -> None:
        """Stop the worker."""
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None


def default_jobs() -> int:
    """Worker processes for a run: the usable cores."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def lint_paths(
    files: Sequence[str],
    rules: Sequence[type[Rule]],
    jobs: Optional[int] = None,
    *,
    codes_for: Optional[Callable[[str], Sequence[str]]] = None,
    progress: Optional[Callable[[], None]] = None,
    cache: "Optional[Cache]" = None,
    selection_for: Optional[Callable[[str], str]] = None,
    before_linting: Optional[Callable[[], None]] = None,
    budget_for: Optional[Callable[[str], Budget]] = None,
    data: Optional[bytes] = None,
    project_for: "Optional[Callable[[str], Optional[ProjectIndex]]]" = None,
) -> RunResult:
    """Lint ``files`` in supervised workers (see :func:`supervised`).

    Args:
        files: paths to lint (Python files or notebooks).
        rules: the rules for every file, unless ``codes_for`` is given.
        jobs: worker processes (default: cores); one unless there are at
            least :data:`POOL_THRESHOLD` files.
        codes_for: per-file rule codes (config-aware); overrides ``rules``.
            Called in this process, so it may raise (e.g. a config error).
        progress: called once per finished file (for a progress bar).
        cache: content-hash cache; files whose entry exists are not linted;
            saved once, when the run ends. Budget outcomes (time-outs,
            crashes) are not cached.
        selection_for: per-file text that determines the rule selection
            (part of the cache key; default: the rule codes).
        before_linting: called once before linting, unless the cache answers
            the whole run (entries exist only for valid settings); may raise
            (e.g. to validate selectors).
        budget_for: per-file :class:`~torchgradlint.limits.Budget` (default:
            :data:`~torchgradlint.limits.DEFAULT_BUDGET`).
        data: the bytes of the single file in ``files`` (standard input),
            instead of reading it.
        project_for: the project index of a file
            (:mod:`torchgradlint.project_index`), or ``None`` for a file
            linted alone. A cached result that rests on other project files
            hits only while they are unchanged; summaries the workers make
            are saved with the cache.
    """
    codes = tuple(r.code for r in rules)
    out = RunResult(files=len(files))
    pending: "list[tuple[str, Optional[bytes], Optional[EntryKey]]]" = []
    hits = 0
    indexes: "dict[str, Optional[ProjectIndex]]" = {f: project_for(f) for f in files} if project_for else {}
    for f in files:
        index = indexes.get(f)
        if cache is None:
            pending.append((f, data, None))
            continue
        raw = read_file(f) if data is None else data
        if not isinstance(raw, bytes):
            out.add(raw.diagnostics, raw.parsed)
            _tick(progress)
            continue
        selection = selection_for(f) if selection_for is not None else ",".join(codes)
        if budget_for is not None:  # a size-budget outcome depends on the budget
            selection += repr(budget_for(f).max_file_size)
        if index is not None:
            selection += "+project"
        key = cache.key(raw, f, selection)
        hit = cache.get(key, f, index.still_valid if index is not None else None)
        if hit is not None:
            out.add(hit[0], hit[1])
            hits += 1
            _tick(progress)
        else:
            pending.append((f, raw, key))
    if before_linting is not None and (pending or not hits):
        before_linting()
    by_size = sorted(pending, key=lambda p: -_size(p[0], p[1]))
    work = [(f, tuple(codes_for(f)) if codes_for is not None else codes, raw,
             budget_for(f) if budget_for is not None else DEFAULT_BUDGET, _project_key(indexes.get(f)))
            for f, raw, _ in by_size]
    jobs = jobs or default_jobs()
    results = supervised(work, jobs if len(work) >= POOL_THRESHOLD else 1) if work else iter(())
    try:
        for i, outcome, from_worker in results:
            diags, parsed, err = outcome[:3]
            deps: list = []
            index = indexes.get(by_size[i][0])
            if len(outcome) > 3 and index is not None:
                deps, made = outcome[3]
                index.merge(made)
            out.add(diags, parsed, err)
            key = by_size[i][2]
            if from_worker and not err and cache is not None and key is not None:
                cache.put(key, diags, parsed, deps)
            _tick(progress)
    finally:
        if hasattr(results, "close"):
            results.close()
        if cache is not None:
            cache.save()
            for index in {id(x): x for x in indexes.values() if x is not None}.values():
                index.save(cache)
    out.diagnostics.sort(key=order_key)
    return out


def _project_key(index: "Optional[ProjectIndex]") -> Optional[tuple[str, Optional[str]]]:
    """What a worker needs to open the same index: ``(root, store)``."""
    if index is None:
        return None
    return str(index.root), None if index.store is None else str(index.store)


def _tick(progress: Optional[Callable[[], None]]) -> None:
    if progress is not None:
        progress()


def _size(path: str, data: Optional[bytes]) -> int:
    if data is not None:
        return len(data)
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
