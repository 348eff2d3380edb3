"""Lint one source text: prefilter, parse once, build the analysis model once,
run every enabled rule over it, resolve positions only for reported nodes.
"""

from __future__ import annotations

import ast
import contextlib
import gc
import tokenize
from typing import Iterator, Optional, Sequence

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from .analysis import build_model
from .diagnostics import PARSE_ERROR_CODE, Diagnostic, Fix, LintResult, read_file
from .lines import bytes_readline
from .noqa import NoqaFilter
from .prefilter import candidate_rules
from .registry import Rule

def _no_validation(self: cst.CSTNode) -> None:
    return None


@contextlib.contextmanager
def _parser_output_unvalidated() -> Iterator[None]:
    """Skip LibCST's per-node ``_validate()`` while the parser builds a tree.

    Every node's ``__post_init__`` re-validates what the parser just produced
    (about a third of ``parse_module``'s time on real files; LibCST's own
    source notes validation could be skipped when parsing). Parser output is
    valid by construction, so the check is skipped inside this block only and
    restored afterwards, also on error.
    """
    base = cst.CSTNode
    original = base.__dict__.get("__post_init__")
    if original is None:  # a LibCST without the hook: nothing to skip
        yield
        return
    base.__post_init__ = _no_validation  # type: ignore[method-assign]
    try:
        yield
    finally:
        base.__post_init__ = original  # type: ignore[method-assign]


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
    15-20% less time for it on the real-code corpus. A collector that was
    already disabled stays disabled.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def parse_module(source: str) -> cst.Module:
    """``libcst.parse_module`` without re-validating the parser's own output.

    Raises:
        libcst.ParserSyntaxError: the source does not parse.
    """
    with _parser_output_unvalidated():
        return cst.parse_module(source)


def decode_source(data: bytes) -> str:
    """Decode file bytes the way Python does (PEP 263 cookie, BOM, UTF-8).

    Raises:
        UnicodeDecodeError: the bytes are not valid in the declared encoding.
        SyntaxError: the encoding cookie names an unknown codec.
    """
    encoding, _ = tokenize.detect_encoding(bytes_readline(data))
    text = data.decode(encoding)
    if text.startswith("\ufeff"):
        text = text[1:]
    return text


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

    A syntax error yields a single ``TGL000`` diagnostic instead of raising.
    """
    with _cyclic_gc_paused():
        # ``_lint_paused`` returns only diagnostics: its trees are freed by
        # reference counting before the collector resumes, so the collection
        # that resumes it walks a small heap, not a whole LibCST tree.
        return _lint_paused(source, path, rules, apply_noqa, tree)


def _lint_paused(source: str, path: str, rules: Sequence[type[Rule]], apply_noqa: bool,
                 tree: Optional[ast.Module]) -> LintResult:
    """:func:`lint_source`'s work, run with the cyclic collector paused."""
    active = candidate_rules(source, rules, tree)
    if not active:
        return LintResult([], False)
    try:
        module = parse_module(source)
    except cst.ParserSyntaxError as exc:
        return LintResult([_parse_error(source, path, exc)], True)
    except RecursionError:
        return LintResult([Diagnostic(PARSE_ERROR_CODE,
                                      "file is nested too deeply to be parsed, so it was not linted",
                                      path, 1, 1, 1, 1)], True)
    model = build_model(module, source, path)
    found = []
    for rule_cls in active:
        for finding in rule_cls().check(model):
            found.append((rule_cls, finding))
    if not found:
        return LintResult([], True)
    positions = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    diags: dict[tuple, Diagnostic] = {}
    for rule_cls, finding in found:
        rng = positions[finding.node]
        fix = None
        if finding.fix is not None:
            old, new = finding.fix
            orng = positions[old]
            fix = Fix((orng.start.line, orng.start.column + 1), (orng.end.line, orng.end.column + 1),
                      module.code_for_node(new), finding.fix_safe)
        d = Diagnostic(rule_cls.code, finding.message, path, rng.start.line, rng.start.column + 1,
                       rng.end.line, rng.end.column + 1, fix, detail=finding.detail or None)
        diags.setdefault((d.code, d.line, d.col), d)
    out = sorted(diags.values(), key=lambda d: d.sort_key)
    if apply_noqa:
        out = NoqaFilter(source).filter(out)
    return LintResult(out, True)


def lint_bytes(data: bytes, path: str, rules: Sequence[type[Rule]], *, apply_noqa: bool = True) -> LintResult:
    """:func:`lint_source` for raw file bytes; undecodable bytes give one
    ``TGL000`` diagnostic."""
    try:
        source = decode_source(data)
    except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
        reason = exc.reason if isinstance(exc, UnicodeDecodeError) else str(exc)
        return LintResult([Diagnostic(PARSE_ERROR_CODE,
                                      f"file could not be decoded, so it was not linted: {reason}",
                                      path, 1, 1, 1, 1)], False)
    return lint_source(source, path, rules, apply_noqa=apply_noqa)


def lint_data(data: bytes, path: str, rules: Sequence[type[Rule]]) -> LintResult:
    """Lint one file's bytes: a Jupyter notebook when ``path`` ends in
    ``.ipynb`` (see :mod:`torchgradlint.notebook`), else Python source."""
    from .notebook import is_notebook, lint_notebook_bytes

    if is_notebook(path):
        return lint_notebook_bytes(data, path, rules)
    return lint_bytes(data, path, rules)


def lint_file(path: str, rules: Sequence[type[Rule]], *, display: Optional[str] = None) -> LintResult:
    """Read and lint one file (Python or notebook). Unreadable files give one
    ``TGL000`` diagnostic."""
    data = read_file(path, display)
    if isinstance(data, LintResult):
        return data
    return lint_data(data, display or path, rules)
