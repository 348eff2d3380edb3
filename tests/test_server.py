"""``torchgradlint server`` driven by a real LSP client (pygls's
LanguageClient) over standard input/output of a server subprocess."""

import asyncio
import sys
from pathlib import Path

import pytest

pytest.importorskip("pygls", reason="the 'server' extra (pygls) is part of the dev extra")

from lsprotocol import types  # noqa: E402
from pygls.lsp.client import LanguageClient  # noqa: E402

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BAD = (FIXTURES / "TGL001" / "bad_basic_loop.py").read_text()
OK = (FIXTURES / "TGL001" / "ok_zero_grad_each_step.py").read_text()
BAD_APPEND = (FIXTURES / "TGL101" / "bad_losses_append.py").read_text()


class Session:
    """A client connected to a fresh server; diagnostics land in a queue per URI."""

    def __init__(self) -> None:
        self.client = LanguageClient("test-client", "1")
        self.published: dict[str, asyncio.Queue] = {}

        @self.client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
            self.queue(params.uri).put_nowait(params)

    def queue(self, uri: str) -> asyncio.Queue:
        return self.published.setdefault(uri, asyncio.Queue())

    async def start(self, root: Path) -> None:
        await self.client.start_io(sys.executable, "-m", "torchgradlint", "server")
        await self.client.initialize_async(types.InitializeParams(
            capabilities=types.ClientCapabilities(), root_uri=root.as_uri()))
        self.client.initialized(types.InitializedParams())

    async def next_diagnostics(self, uri: str) -> types.PublishDiagnosticsParams:
        return await asyncio.wait_for(self.queue(uri).get(), timeout=60)

    def open(self, path: Path, text: str) -> str:
        uri = path.as_uri()
        self.client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        return uri

    def replace(self, uri: str, text: str, version: int) -> None:
        self.client.text_document_did_change(types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))

    async def stop(self) -> None:
        await self.client.shutdown_async(None)
        self.client.exit(None)
        await self.client.stop()


def run(scenario, tmp_path):
    async def main():
        session = Session()
        await session.start(tmp_path)
        try:
            await scenario(session)
        finally:
            await session.stop()
    asyncio.run(main())


def test_diagnostics_on_open_and_change_match_check(tmp_path):
    path = tmp_path / "train.py"

    async def scenario(s):
        uri = s.open(path, BAD)
        got = await s.next_diagnostics(uri)
        assert [(d.code, d.range.start.line, d.range.start.character, d.source) for d in got.diagnostics] == [
            ("TGL001", 15, 8, "torchgradlint")]  # check: train.py:16:9
        assert got.diagnostics[0].severity == types.DiagnosticSeverity.Warning
        assert got.diagnostics[0].code_description.href.endswith("TGL001.md")
        s.replace(uri, OK, 2)
        assert list((await s.next_diagnostics(uri)).diagnostics) == []
        s.replace(uri, "import torch\ndef f(:\n    loss.backward()\n    opt.step()\n", 3)
        broken = (await s.next_diagnostics(uri)).diagnostics
        assert [(d.code, d.severity) for d in broken] == [("TGL000", types.DiagnosticSeverity.Error)]

    run(scenario, tmp_path)


def test_code_actions_fix_and_noqa_and_hover(tmp_path):
    path = tmp_path / "train.py"

    async def scenario(s):
        uri = s.open(path, BAD_APPEND)
        diags = (await s.next_diagnostics(uri)).diagnostics
        fixable = [d for d in diags if d.code == "TGL101"]
        assert fixable
        d = fixable[0]
        actions = await s.client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=d.range,
            context=types.CodeActionContext(diagnostics=[d])))
        titles = [a.title for a in actions]
        assert "Fix TGL101" in titles and "Add `# noqa: TGL101`" in titles
        fix = next(a for a in actions if a.title == "Fix TGL101")
        (edit,) = fix.edit.changes[uri]
        line = BAD_APPEND.splitlines()[edit.range.start.line]
        old = line[edit.range.start.character:edit.range.end.character]
        assert (old, edit.new_text) == ("loss", "loss.item()")  # what `check --diff` proposes
        noqa = next(a for a in actions if a.title.startswith("Add"))
        (nedit,) = noqa.edit.changes[uri]
        assert nedit.new_text == "  # noqa: TGL101" and nedit.range.start.line == d.range.start.line

        # applying the noqa edit silences the finding
        lines = BAD_APPEND.splitlines(keepends=True)
        n = d.range.start.line
        lines[n] = lines[n].rstrip("\n") + nedit.new_text + "\n"
        s.replace(uri, "".join(lines), 2)
        assert not [x for x in (await s.next_diagnostics(uri)).diagnostics if x.range.start.line == n]

        hover = await s.client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=d.range.start))
        assert hover is None  # silenced: nothing to explain any more
        s.replace(uri, BAD_APPEND, 3)
        await s.next_diagnostics(uri)
        hover = await s.client.text_document_hover_async(types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=d.range.start))
        assert "TGL101" in hover.contents.value and "## What it does" in hover.contents.value

    run(scenario, tmp_path)


def test_settings_come_from_pyproject(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[tool.torchgradlint]\nignore = ["TGL001"]\n')

    async def scenario(s):
        uri = s.open(project / "train.py", BAD)
        assert list((await s.next_diagnostics(uri)).diagnostics) == []
        other = s.open(tmp_path / "train.py", BAD)
        assert [d.code for d in (await s.next_diagnostics(other)).diagnostics] == ["TGL001"]

    run(scenario, tmp_path)


def test_a_burst_of_edits_ends_with_the_latest_text(tmp_path):
    """Debounce: edits sent while a lint runs are coalesced; the last
    diagnostics published are those of the last text."""
    path = tmp_path / "train.py"

    async def scenario(s):
        uri = s.open(path, OK)
        await s.next_diagnostics(uri)
        for version in range(2, 12):
            s.replace(uri, OK if version % 2 else BAD, version)
        last = None
        while True:
            try:
                last = await asyncio.wait_for(s.queue(uri).get(), timeout=3)
            except asyncio.TimeoutError:
                break
        assert last is not None and last.version == 11
        assert list(last.diagnostics) == []  # version 11 is OK

    run(scenario, tmp_path)


def test_noqa_edit_adds_a_comment_or_extends_the_list():
    from torchgradlint.server import _noqa_edit, utf16_column

    lines = ["    losses.append(loss)   ", "x = 1  # noqa: E501", "y = 2  # noqa", "z = 'é𝛼' + w  # noqa: TGL101"]
    new = _noqa_edit(lines, 1, "TGL101")
    assert (new.range.start.character, new.range.end.character, new.new_text) == (23, 26, "  # noqa: TGL101")
    extend = _noqa_edit(lines, 2, "TGL101")
    assert (extend.range.start.character, extend.new_text) == (len(lines[1]), ", TGL101")
    assert _noqa_edit(lines, 3, "TGL101") is None  # a bare noqa already silences it
    assert _noqa_edit(lines, 4, "TGL101") is None  # already listed
    # 'é' is one UTF-16 unit, '𝛼' (outside the BMP) two: columns after it shift by one
    assert [utf16_column(lines[3], col) for col in (6, 7, 8, 9)] == [5, 6, 8, 9]


def test_a_document_that_hangs_the_parser_is_one_tgl000_and_the_server_goes_on(tmp_path):
    (tmp_path / "pyproject.toml").write_text("[tool.torchgradlint]\nfile-timeout = 1\n")
    chain = "import torch\ny = " + " + ".join(["a"] * 20000) + "\nloss.backward()\n"

    async def scenario(s):
        uri = s.open(tmp_path / "gen.py", chain)
        got = (await s.next_diagnostics(uri)).diagnostics
        assert [d.code for d in got] == ["TGL000"] and "file-timeout budget of 1 s" in got[0].message
        s.replace(uri, BAD, 2)  # a fresh worker lints the next text
        assert [d.code for d in (await s.next_diagnostics(uri)).diagnostics] == ["TGL001"]

    run(scenario, tmp_path)


def test_unchanged_text_is_not_linted_again(tmp_path):
    """The same text under the same settings (a save after the change that
    produced it) reuses the last diagnostics; new text, or a result that is a
    time-out/crash ``TGL000``, is linted again."""
    from torchgradlint.diagnostics import PARSE_ERROR_CODE, Diagnostic
    from torchgradlint.server import TorchGradLintServer

    server = TorchGradLintServer()
    server.worker.close()
    sent = []
    outcome = ([Diagnostic("TGL001", "m", "train.py", 16, 9, 16, 20)], True, None)

    def lint(path, codes, data, budget):
        sent.append(data)
        return outcome

    server.worker.lint = lint
    uri = (tmp_path / "train.py").as_uri()
    first = server.lint_text(uri, BAD)
    assert server.lint_text(uri, BAD) == first and len(sent) == 1
    server.lint_text(uri, BAD + "\n")
    assert len(sent) == 2
    outcome = ([Diagnostic(PARSE_ERROR_CODE, "timed out", "train.py", 1, 1, 1, 1)], False, None)
    server.lint_text(uri, OK)
    server.lint_text(uri, OK)
    assert len(sent) == 4
