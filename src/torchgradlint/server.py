"""``torchgradlint server``: a Language Server (LSP over standard input/output).

Built on pygls (the ``server`` extra). An editor starts it once and keeps it:
LibCST, the rules and the analysis are imported once, so a diagnostic costs
one lint of the edited text, not a process start (flake8 pays ``import
libcst``, about 0.4 s, on every save).

Features:

- **Diagnostics**, the same as ``torchgradlint check`` gives for the file:
  published on open, change and save. Changes are debounced by coalescing:
  one lint runs at a time (in a worker thread, so the server keeps
  answering), and edits that arrive meanwhile are linted once, as the latest
  text, when it finishes; plus an optional delay (initialization option
  ``debounce``, seconds, default 0).
- **Code actions**: each safe autofix (the engine's ``Diagnostic.fix``;
  unsafe ones too when the initialization option ``unsafeFixes`` is true),
  and "add ``# noqa: TGLnnn``" for every diagnostic.
- **Hover** over a diagnostic's span: the rule's documentation (What it does
  / Why is this bad? / Example / Use instead).
- **Settings** from the file's ``[tool.torchgradlint]`` (the nearest
  ``pyproject.toml``, as the CLI finds it; re-read after any save):
  select, ignore, per-file-ignores, exclude and both budgets.

The lint runs in one resident worker process
(:class:`~torchgradlint.runner.ResidentWorker`): a document that hangs
LibCST's parser past ``file-timeout``, or crashes it, is one ``TGL000`` and
the worker is replaced; the server never stops answering. The worker keeps
each open document's last parse and, after an edit, parses again only the
top-level statements (and the statements of a top-level class, function or
block) whose text changed (:mod:`torchgradlint.incremental`).

Positions: the engine's columns are 1-based code points; LSP's are 0-based
UTF-16 code units (the protocol's default encoding), converted per line.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, Optional

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from . import __version__
from .diagnostics import PARSE_ERROR_CODE, Diagnostic
from .lines import split_lines
from .runner import ResidentWorker

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)


def utf16_column(line: str, col: int) -> int:
    """0-based UTF-16 offset of the 1-based code-point column ``col`` in ``line``."""
    prefix = line[: max(0, col - 1)]
    return len(prefix.encode("utf-16-le")) // 2


def _position(lines: list[str], line: int, col: int) -> types.Position:
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    return types.Position(line=max(0, line - 1), character=utf16_column(text, col))


def _range(lines: list[str], line: int, col: int, end_line: int, end_col: int) -> types.Range:
    return types.Range(start=_position(lines, line, col), end=_position(lines, end_line, end_col))


class TorchGradLintServer(LanguageServer):
    """The language server: per open document, the latest diagnostics and
    the state of its lint (running, or waiting for newer text)."""

    def __init__(self) -> None:
        super().__init__("torchgradlint", __version__,
                         text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.debounce = 0.0
        self.unsafe_fixes = False
        self.results: dict[str, list[Diagnostic]] = {}
        self._running: dict[str, asyncio.Task] = {}
        self._dirty: set[str] = set()
        # uri -> (text, codes, budget, diagnostics) of its last lint
        self._linted: dict[str, tuple[str, tuple[str, ...], Any, list[Diagnostic]]] = {}
        self.worker = ResidentWorker()  # the lint runs there: a hang or crash costs one TGL000

    # -- linting ---------------------------------------------------------------
    def lint_text(self, uri: str, source: str) -> list[Diagnostic]:
        """The diagnostics of ``check`` for one document's text (runs in a
        worker thread). A malformed ``pyproject.toml`` is one ``TGL000`` on line 1.

        Text linted before under the same rules and budget (a save after
        the change that produced it, a re-open) gets the same diagnostics
        again without a lint; a time-out or crash (``TGL000``) is never reused."""
        from .config import ConfigError, Settings
        from .registry import SelectionError

        path = to_fs_path(uri) or uri
        settings = Settings()
        try:
            cfg = settings.config_for(path)
            if cfg is not None and cfg.excludes(Path(path)):
                return []
            codes = settings.codes_for(path)
            budget = settings.budget_for(path)
        except (ConfigError, SelectionError) as exc:
            return [Diagnostic(PARSE_ERROR_CODE, str(exc), path, 1, 1, 1, 1)]
        last = self._linted.get(uri)
        if last is not None and last[0] == source and last[1] == tuple(codes) and last[2] == budget:
            return last[3]
        diagnostics, _, error = self.worker.lint(path, codes, source.encode("utf-8", "surrogatepass"), budget)
        if error:
            self.window_log_message(types.LogMessageParams(type=types.MessageType.Error, message=error))
        if error or any(d.code == PARSE_ERROR_CODE for d in diagnostics):
            self._linted.pop(uri, None)
        else:
            self._linted[uri] = (source, tuple(codes), budget, diagnostics)
        return diagnostics

    def schedule(self, uri: str) -> None:
        """Lint ``uri`` soon: now when idle, else once the running lint ends."""
        if uri in self._running:
            self._dirty.add(uri)
            return
        self._running[uri] = asyncio.get_running_loop().create_task(self._lint_loop(uri))

    async def _lint_loop(self, uri: str) -> None:
        try:
            while True:
                self._dirty.discard(uri)
                if self.debounce:
                    await asyncio.sleep(self.debounce)
                    self._dirty.discard(uri)
                try:
                    doc = self.workspace.get_text_document(uri)
                except Exception:  # closed meanwhile
                    return
                version, source = doc.version, doc.source
                found = await asyncio.get_running_loop().run_in_executor(None, self.lint_text, uri, source)
                if uri in self._dirty:
                    continue  # newer text arrived: its lint replaces this one
                self.results[uri] = found
                lines = split_lines(source) or [""]
                self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(
                    uri=uri, version=version, diagnostics=[self.to_lsp(d, lines) for d in found]))
                return
        finally:
            self._running.pop(uri, None)

    @staticmethod
    def to_lsp(d: Diagnostic, lines: list[str]) -> types.Diagnostic:
        """An engine diagnostic as an LSP diagnostic (code, rule URL, severity)."""
        from .registry import get_rule

        href = None
        if d.code != PARSE_ERROR_CODE:
            try:
                href = types.CodeDescription(href=get_rule(d.code).url())
            except KeyError:
                href = None
        return types.Diagnostic(
            range=_range(lines, d.line, d.col, d.end_line, d.end_col), message=d.message, code=d.code,
            source="torchgradlint", code_description=href,
            severity=types.DiagnosticSeverity.Error if d.code == PARSE_ERROR_CODE
            else types.DiagnosticSeverity.Warning)

    # -- code actions and hover ---------------------------------------------------
    def code_actions(self, uri: str, rng: types.Range) -> list[types.CodeAction]:
        """Fixes and "add noqa" for the diagnostics that touch ``rng``."""
        doc = self.workspace.get_text_document(uri)
        lines = split_lines(doc.source) or [""]
        actions = []
        for d in self.results.get(uri, []):
            if d.code == PARSE_ERROR_CODE:
                continue
            if not (d.line - 1 <= rng.end.line and rng.start.line <= d.end_line - 1):
                continue
            diag = [self.to_lsp(d, lines)]
            if d.fix is not None and (d.fix.safe or self.unsafe_fixes):
                edit = types.TextEdit(range=_range(lines, *d.fix.start, *d.fix.end), new_text=d.fix.replacement)
                actions.append(types.CodeAction(
                    title=f"Fix {d.code}" + ("" if d.fix.safe else " (unsafe)"),
                    kind=types.CodeActionKind.QuickFix, diagnostics=diag, is_preferred=d.fix.safe,
                    edit=types.WorkspaceEdit(changes={uri: [edit]})))
            noqa = _noqa_edit(lines, d.line, d.code)
            if noqa is not None:
                actions.append(types.CodeAction(
                    title=f"Add `# noqa: {d.code}`", kind=types.CodeActionKind.QuickFix, diagnostics=diag,
                    edit=types.WorkspaceEdit(changes={uri: [noqa]})))
        return actions

    def hover(self, uri: str, pos: types.Position) -> Optional[types.Hover]:
        """The rule documentation of the diagnostics under ``pos``."""
        from .registry import get_rule

        doc = self.workspace.get_text_document(uri)
        lines = split_lines(doc.source) or [""]
        parts = []
        for d in self.results.get(uri, []):
            r = _range(lines, d.line, d.col, d.end_line, d.end_col)
            at = (pos.line, pos.character)
            inside = (r.start.line, r.start.character) <= at <= (r.end.line, r.end.character)
            if not inside or d.code == PARSE_ERROR_CODE:
                continue
            rule = get_rule(d.code)
            parts.append(f"**{rule.code} {rule.name}**: {d.message}\n\n{rule.docs.strip()}\n\n"
                         f"[{rule.url()}]({rule.url()})")
        if not parts:
            return None
        value = "\n\n---\n\n".join(parts)
        return types.Hover(contents=types.MarkupContent(kind=types.MarkupKind.Markdown, value=value))


def _noqa_edit(lines: list[str], line: int, code: str) -> Optional[types.TextEdit]:
    """The edit that silences ``code`` on 1-based ``line``: a new ``# noqa:
    CODE`` comment, or ``CODE`` added to the line's ``# noqa: ...`` list;
    ``None`` when a bare ``# noqa`` already silences everything."""
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    m = _NOQA.search(text)
    if m is None:
        start = utf16_column(text, len(text.rstrip()) + 1)  # trailing whitespace is replaced
        end = utf16_column(text, len(text) + 1)
        return types.TextEdit(range=types.Range(start=types.Position(line=line - 1, character=start),
                                                end=types.Position(line=line - 1, character=end)),
                              new_text=f"  # noqa: {code}")
    if m.group("codes") is None or code in m.group("codes").upper():
        return None
    at = utf16_column(text, m.end("codes") + 1)
    return types.TextEdit(range=types.Range(start=types.Position(line=line - 1, character=at),
                                            end=types.Position(line=line - 1, character=at)),
                          new_text=f", {code}")


def build_server() -> TorchGradLintServer:
    """A server with every feature registered (not started)."""
    server = TorchGradLintServer()

    @server.feature(types.INITIALIZE)
    def initialize(ls: TorchGradLintServer, params: types.InitializeParams) -> None:
        options: Any = params.initialization_options or {}
        if isinstance(options, dict):
            ls.debounce = float(options.get("debounce", 0.0) or 0.0)
            ls.unsafe_fixes = bool(options.get("unsafeFixes", False))

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: TorchGradLintServer, params: types.DidOpenTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: TorchGradLintServer, params: types.DidChangeTextDocumentParams) -> None:
        ls.schedule(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: TorchGradLintServer, params: types.DidSaveTextDocumentParams) -> None:
        from .config import clear_cache

        clear_cache()  # a saved pyproject.toml may have changed the settings
        ls.schedule(params.text_document.uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: TorchGradLintServer, params: types.DidCloseTextDocumentParams) -> None:
        uri = params.text_document.uri
        ls.results.pop(uri, None)
        ls._linted.pop(uri, None)
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    @server.feature(types.TEXT_DOCUMENT_CODE_ACTION,
                    types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix]))
    def code_action(ls: TorchGradLintServer, params: types.CodeActionParams) -> list[types.CodeAction]:
        return ls.code_actions(params.text_document.uri, params.range)

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    def hover(ls: TorchGradLintServer, params: types.HoverParams) -> Optional[types.Hover]:
        return ls.hover(params.text_document.uri, params.position)

    return server


def main() -> int:
    """Run the server over standard input/output until the client exits."""
    server = build_server()
    try:
        server.start_io()
    finally:
        server.worker.close()
    return 0
