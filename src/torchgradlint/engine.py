"""Lint one source text: prefilter, parse once, build the analysis model once,
run every enabled rule over it, resolve positions only for reported nodes.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import gc
import os
import re
import threading
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import libcst as cst

from .analysis import build_model
from .diagnostics import PARSE_ERROR_CODE, Diagnostic, Fix, LintResult, read_file, split_message
from .limits import DEFAULT_BUDGET, Budget, size_diagnostic
from .lines import bytes_readline, decode_source, split_lines  # noqa: F401  (decode_source: re-exported)
from .noqa import NoqaFilter
from .cells import foreign_spans, in_spans
from .notebook import (JoinedSource, is_notebook, map_to_cells, read_notebook, unparsable_cells,
                       without_ipython_syntax)
from .positions import node_ranges
from .prefilter import FileFacts, candidate_rules
from .project_index import revived_rules
from .registry import Rule

if TYPE_CHECKING:  # pragma: no cover
    from .incremental import IncrementalParser
    from .project_index import ProjectIndex, ProjectView


class _ParsingThreads(threading.local):
    """Per thread: how deep this thread is inside :func:`_parser_output_unvalidated`."""

    depth = 0


_PARSING = _ParsingThreads()
_PATCH_LOCK = threading.Lock()
_patch_users = 0  # threads inside _parser_output_unvalidated; guarded by _PATCH_LOCK
_validate_post_init = None  # LibCST's own CSTNode.__post_init__, once first patched


def _post_init_unless_parsing(self: cst.CSTNode) -> None:
    """``CSTNode.__post_init__`` while some thread parses: skip validation in
    the parsing thread only; every other thread's nodes are validated."""
    if _PARSING.depth:
        return None
    return _validate_post_init(self)  # type: ignore[misc]


@contextlib.contextmanager
def _parser_output_unvalidated() -> Iterator[None]:
    """Skip LibCST's per-node ``_validate()`` while this thread's parser builds a tree.

    Every node's ``__post_init__`` re-validates what the parser just produced
    (about a third of ``parse_module``'s time on real files; LibCST's own
    source notes validation could be skipped when parsing). Parser output is
    valid by construction, so the check is skipped inside this block only.

    The hook is a class attribute, so the swap is process-wide; it is made
    safe for hosts with threads (flake8, the language server, a user's
    program): the replacement skips validation only in a thread that is
    inside this block (a thread-local depth), so nodes that other threads
    build meanwhile are still validated; a lock and a count of the threads
    inside keep the swap in place until the last one leaves, then LibCST's
    own hook is restored, also on error. Re-entrant.
    """
    global _patch_users, _validate_post_init
    base = cst.CSTNode
    with _PATCH_LOCK:
        original = base.__dict__.get("__post_init__")
        if original is None:  # a LibCST without the hook: nothing to skip
            patched = False
        else:
            patched = True
            if _patch_users == 0:
                # Kept after the swap is undone: a thread that looked the hook up
                # just before may still call the replacement, which then validates.
                _validate_post_init = original
                base.__post_init__ = _post_init_unless_parsing  # type: ignore[method-assign]
            _patch_users += 1
    if not patched:
        yield
        return
    _PARSING.depth += 1
    try:
        yield
    finally:
        _PARSING.depth -= 1
        with _PATCH_LOCK:
            _patch_users -= 1
            if _patch_users == 0:
                base.__post_init__ = _validate_post_init  # type: ignore[method-assign]


_GC_LOCK = threading.Lock()
_gc_pausers = 0  # threads inside _cyclic_gc_paused; guarded by _GC_LOCK
_gc_was_enabled = False  # the collector's state when the first of them entered


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while one file is linted.

    A LibCST parse allocates hundreds of thousands of objects; each batch of
    allocations triggers a collection that walks the young objects, and the
    older generations (the whole heap) get walked again and again during one
    parse. LibCST trees have no parent links, so they are freed by reference
    counting alone; the analysis model's few cycles are collected once the
    collector resumes. Timed with ``gc.callbacks`` over the 82-file benchmark
    corpus (25 files parsed): collections took 9-12% of the lint's CPU time
    (about 470 collections), paused 5-6% (66, outside the parse). The
    prefilter's Python ``ast`` (acyclic too) is built inside the pause:
    15-20% less time for it on the real-code corpus.

    The collector's switch is process-wide: with threads linting at once, the
    first to enter pauses it and the last to leave restores the state the
    first one found (a lock and a count), so one thread cannot switch it back
    on under another; a collector that was already disabled stays disabled.
    """
    global _gc_pausers, _gc_was_enabled
    with _GC_LOCK:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def parse_module(source: str) -> cst.Module:
    """``libcst.parse_module`` without re-validating the parser's own output.

    Raises:
        libcst.ParserSyntaxError: the source does not parse.
    """
    with _parser_output_unvalidated():
        return cst.parse_module(source)


def _parse_error(source: str, path: str, exc: cst.ParserSyntaxError) -> Diagnostic:
    """One TGL000 diagnostic for a file LibCST cannot parse.

    LibCST's native parser often points past the real error; Python's own
    compiler gives the precise place and message, so ask it first (only on
    this rare path).
    """
    try:
        compile(source, path, "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
    except SyntaxError as err:
        line = err.lineno or 1
        col = err.offset or 1
        return Diagnostic(PARSE_ERROR_CODE, f"file could not be parsed, so it was not linted: {err.msg}",
                          path, line, col, line, col)
    except (ValueError, RecursionError, MemoryError):
        pass
    line, col = exc.raw_line, exc.raw_column + 1
    return Diagnostic(
        PARSE_ERROR_CODE,
        f"file could not be parsed, so it was not linted: {exc.message}",
        path, line, col, line, col,
    )


def lint_source(
    source: str,
    path: str,
    rules: Sequence[type[Rule]],
    *,
    apply_noqa: bool = True,
    tree: Optional[ast.Module] = None,
    project: Optional["ProjectIndex"] = None,
    facts: Optional[FileFacts] = None,
    parser: Optional["IncrementalParser"] = None,
) -> LintResult:
    """All diagnostics of ``rules`` for one file's text, sorted by position.

    Args:
        source: the file's text.
        path: the name shown in diagnostics.
        rules: enabled rule classes.
        apply_noqa: drop findings silenced by ``# noqa`` (the flake8 plugin
            passes ``False``: flake8 applies noqa itself).
        tree: the file's Python ``ast``, when the caller has it (flake8
            does), for the prefilter's second stage.
        project: the index of the file's project, to resolve names it
            imports from other files (:mod:`torchgradlint.project_index`);
            the result's ``deps`` then lists the files consulted.
        facts: the prefilter's :class:`~torchgradlint.prefilter.FileFacts` of
            ``source``, when the caller already asked the prefilter (the
            flake8 plugin does): its tree, call scan and premise verdicts
            are reused; ``tree`` is then ignored.
        parser: the :class:`~torchgradlint.incremental.IncrementalParser`
            of the document when a long-lived host lints it again after
            edits (the language server): only the top-level statements
            whose text changed are parsed again.

    A syntax error yields a single ``TGL000`` diagnostic instead of raising.
    """
    with _cyclic_gc_paused():
        # ``_lint_paused`` returns only diagnostics: its trees are freed by
        # reference counting before the collector resumes, so the collection
        # that resumes it walks a small heap, not a whole LibCST tree.
        return _lint_paused(source, path, rules, apply_noqa, facts or FileFacts(source, tree), project, parser)


def _lint_paused(source: str, path: str, rules: Sequence[type[Rule]], apply_noqa: bool,
                 facts: FileFacts, project: Optional["ProjectIndex"] = None,
                 parser: Optional["IncrementalParser"] = None) -> LintResult:
    """:func:`lint_source`'s work, run with the cyclic collector paused;
    ``facts`` answers every prefilter question (one Python ``ast``, one call
    scan)."""
    active = candidate_rules(source, rules, facts=facts)
    used: dict[str, str] = {}
    revivable: list[type[Rule]] = []
    if project is not None:  # rules that facts of other project files bring in
        run, revivable = revived_rules(lambda: project, path, source, rules, active, facts, used)
        active = [*active, *run]
    if not active:
        return LintResult([], False, [[p, d] for p, d in sorted(used.items())])
    indents: Optional[_ExpandedIndentation] = None
    text = source  # what LibCST parses: ``source``, or it re-spelled line for line
    try:
        try:
            module = parse_module(source) if parser is None else parser.parse(source, facts.tree)
        except cst.ParserSyntaxError as exc:
            indents = _ExpandedIndentation.for_rejected(source)
            python = without_ipython_syntax(source) if indents is None else None
            if indents is None and python is None:
                return LintResult([_parse_error(source, path, exc)], True)
            # a notebook exported as a script keeps its magics and shell escapes: lint the Python
            text = indents.text if indents is not None else python  # type: ignore[assignment]
            try:
                module = parse_module(text)
            except cst.ParserSyntaxError as again:  # the error past the IPython lines (same line numbers)
                return LintResult([_parse_error(text, path, again)], True)
    except cst.ParserSyntaxError as exc:
        return LintResult([_parse_error(source, path, exc)], True)
    except RecursionError:
        return LintResult([_too_deep(path, "parsed")], True)
    view = project.view(path, module, used) if project is not None else None
    try:
        diags = _diagnostics(module, text, path, active, facts.built_tree if text is source else None, view,
                             revivable)
    except RecursionError:  # a rule or position pass that recurses per nesting level
        return LintResult([_too_deep(path, "analysed")], True)
    deps = view.deps() if view is not None else []
    if diags and "%%" in source:
        spans = foreign_spans(source)  # cells written for another framework
        diags = [d for d in diags if not in_spans(d.line, spans)]
    if not diags:
        return LintResult([], True, deps)
    if indents is not None:
        diags = [indents.map_back(d) for d in diags]
    out = sorted(diags, key=lambda d: d.sort_key)
    if apply_noqa:
        out = NoqaFilter(source).filter(out)
    return LintResult(out, True, deps)


def _diagnostics(module: cst.Module, source: str, path: str, active: Sequence[type[Rule]],
                 tree: Optional[ast.Module] = None, project: Optional["ProjectView"] = None,
                 revivable: Sequence[type[Rule]] = ()) -> list[Diagnostic]:
    """The findings of ``active`` on a parsed module, one per (code, line,
    column); ``tree``: Python's ``ast`` of ``source``, when the caller has it;
    ``project``: the file's view of its project index; ``revivable``: rules
    that run too when a project decorator of the file switches grad mode."""
    model = build_model(module, source, path, project)
    if revivable and project is not None and project.switches_grad:
        active = [*active, *revivable]
    found = []
    for rule_cls in active:
        for finding in rule_cls().check(model):
            found.append((rule_cls, finding))
    if not found:
        return []
    wanted = {f.node for _, f in found} | {f.fix[0] for _, f in found if f.fix is not None}
    positions = node_ranges(module, wanted, source, tree)
    diags: dict[tuple, Diagnostic] = {}
    for rule_cls, finding in found:
        rng = positions[finding.node]
        fix = None
        if finding.fix is not None:
            old, new = finding.fix
            orng = positions[old]
            fix = Fix((orng.start.line, orng.start.column + 1), (orng.end.line, orng.end.column + 1),
                      module.code_for_node(new), finding.fix_safe)
        # a finding without a detail gets its long text split (message: first clause, detail: the rest)
        message, detail = (finding.message, finding.detail) if finding.detail else split_message(finding.message)
        d = Diagnostic(rule_cls.code, message, path, rng.start.line, rng.start.column + 1,
                       rng.end.line, rng.end.column + 1, fix, detail=detail or None)
        diags.setdefault((d.code, d.line, d.col), d)
    return list(diags.values())


def _too_deep(path: str, what: str) -> Diagnostic:
    return Diagnostic(PARSE_ERROR_CODE, f"file is nested too deeply to be {what}, so it was not linted",
                      path, 1, 1, 1, 1)


_INDENT = re.compile(r"[ \t]*")


class _ExpandedIndentation:
    """A source whose indentation mixes tabs and spaces in a way CPython
    accepts but LibCST's tokenizer rejects, re-spelled with spaces.

    CPython measures indentation twice, with tabs to the next multiple of 8
    and with tabs as one column, and accepts a file when both measures order
    every pair of lines the same way ("Lexical analysis: Indentation",
    https://docs.python.org/3/reference/lexical_analysis.html#indentation).
    LibCST also wants a deeper line to extend the previous line's indentation
    text: ``"    "`` then ``"\t    "`` is rejected though CPython accepts it.
    For a source that ``compile()`` accepts, expanding every line's leading
    whitespace with tab stops of 8 gives the block structure CPython reads,
    so LibCST parses the same program. Only leading whitespace changes, so
    lines are unchanged and a column maps back by the difference in indent
    length (:meth:`map_back`). A whitespace change inside a multi-line string
    alters no call, binding or scope the rules look at.
    """

    def __init__(self, source: str) -> None:
        self.shift: dict[int, tuple[int, int]] = {}  # line -> (expanded indent length, original length)
        lines = split_lines(source, keepends=True)  # lines as Python counts them
        for n, line in enumerate(lines, start=1):
            indent = _INDENT.match(line).group()  # type: ignore[union-attr]
            if "\t" in indent:
                wide = indent.expandtabs(8)
                self.shift[n] = (len(wide), len(indent))
                lines[n - 1] = wide + line[len(indent):]
        self.text = "".join(lines)

    @classmethod
    def for_rejected(cls, source: str) -> "Optional[_ExpandedIndentation]":
        """The re-spelled source when ``source`` has a tab in its indentation
        and CPython compiles it; ``None`` otherwise (a real syntax error)."""
        if "\t" not in source:
            return None
        try:
            compile(source, "<tabs>", "exec", flags=ast.PyCF_ONLY_AST, dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        expanded = cls(source)
        return expanded if expanded.shift else None

    def _col(self, line: int, col: int) -> int:
        wide, orig = self.shift.get(line, (0, 0))
        return col - (wide - orig) if col > wide else min(col, orig + 1)

    def map_back(self, d: Diagnostic) -> Diagnostic:
        """``d`` with columns of the original source; a fix that spans lines
        is dropped (its replacement was printed with the expanded indentation)."""
        fix = d.fix
        if fix is not None:
            if fix.start[0] != fix.end[0] or "\n" in fix.replacement:
                fix = None
            else:
                fix = dataclasses.replace(fix, start=(fix.start[0], self._col(*fix.start)),
                                          end=(fix.end[0], self._col(*fix.end)))
        return dataclasses.replace(d, col=self._col(d.line, d.col), end_col=self._col(d.end_line, d.end_col),
                                   fix=fix)


def lint_bytes(data: bytes, path: str, rules: Sequence[type[Rule]], *, apply_noqa: bool = True,
               project: Optional["ProjectIndex"] = None, parser: Optional["IncrementalParser"] = None) -> LintResult:
    """:func:`lint_source` for raw file bytes; undecodable bytes give one
    ``TGL000`` diagnostic. ``parser``: see :func:`lint_source`."""
    try:
        source = decode_source(data)
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        reason = exc.reason if isinstance(exc, UnicodeDecodeError) else str(exc)
        return LintResult([Diagnostic(PARSE_ERROR_CODE,
                                      f"file could not be decoded, so it was not linted: {reason}",
                                      path, 1, 1, 1, 1)], False)
    return lint_source(source, path, rules, apply_noqa=apply_noqa, project=project, parser=parser)


def lint_data(data: bytes, path: str, rules: Sequence[type[Rule]], *,
              budget: Budget = DEFAULT_BUDGET, project: Optional["ProjectIndex"] = None,
              parser: Optional["IncrementalParser"] = None) -> LintResult:
    """Lint one file's bytes: a Jupyter notebook when ``path`` ends in
    ``.ipynb`` (see :mod:`torchgradlint.notebook`), else Python source. Bytes
    over ``budget.max_file_size`` give one ``TGL000`` and are not parsed.
    ``project``: the index of the file's project; ``parser``: the
    document's incremental parser (both: see :func:`lint_source`)."""
    if budget.too_large(len(data)):
        return LintResult([size_diagnostic(path, len(data), budget)], False)
    if is_notebook(path):
        joined = read_notebook(data, path)
        if isinstance(joined, LintResult):
            return joined
        inner = _lint_notebook(joined, path, rules, project, parser)
        result = map_to_cells(inner, joined)
        result.deps = inner.deps
        return result
    return lint_bytes(data, path, rules, project=project, parser=parser)


def _lint_notebook(joined: JoinedSource, path: str, rules: Sequence[type[Rule]],
                   project: Optional["ProjectIndex"] = None,
                   parser: Optional["IncrementalParser"] = None) -> LintResult:
    """Lint a notebook's joined cells. When the program does not parse, the
    cells that do not compile on their own get one ``TGL000`` each and the
    others are still linted (a placeholder exercise cell must not silence
    the whole notebook)."""
    result = lint_source(joined.source, path, rules, project=project, parser=parser)
    if not any(d.code == PARSE_ERROR_CODE for d in result.diagnostics):
        return result
    bad = unparsable_cells(joined)
    starts = joined.cell_starts()
    if not bad or len(bad) == len(starts):
        return result
    rest = lint_source(joined.blank_cells(set(bad)).source, path, rules, project=project)
    if any(d.code == PARSE_ERROR_CODE for d in rest.diagnostics):
        return result
    errors = [Diagnostic(PARSE_ERROR_CODE, f"cell {cell} could not be parsed, so it was not linted: {msg}",
                         path, starts[cell] + line - 1, col, starts[cell] + line - 1, col)
              for cell, (line, col, msg) in sorted(bad.items())]
    return LintResult(sorted(errors + rest.diagnostics, key=lambda d: d.sort_key), True, rest.deps)


def lint_file(path: str, rules: Sequence[type[Rule]], *, display: Optional[str] = None,
              budget: Budget = DEFAULT_BUDGET, project: Optional["ProjectIndex"] = None) -> LintResult:
    """Read and lint one file (Python or notebook). Unreadable files, and
    files over ``budget.max_file_size`` (checked before reading), give one
    ``TGL000`` diagnostic."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    if budget.too_large(size):
        return LintResult([size_diagnostic(display or path, size, budget)], False)
    data = read_file(path, display)
    if isinstance(data, LintResult):
        return data
    return lint_data(data, display or path, rules, budget=budget, project=project)
