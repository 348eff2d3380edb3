"""Line breaks as Python sees them (``\\n``, ``\\r\\n``, ``\\r``), never
:meth:`str.splitlines`'s wider set, in fixes, noqa, ``full`` output, notebooks
and fixture expectations; and ``--fix`` keeps every byte outside its edits
(BOM, declared encoding, line endings)."""

import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FIXTURES
from torchgradlint.engine import lint_source
from torchgradlint.fixes import UnfixableFile, encode_like, fix_file
from torchgradlint.lines import line_starts, normalize_newlines, split_lines
from torchgradlint.output import RenderContext, renderer
from torchgradlint.registry import all_rules

# Every character str.splitlines() breaks at that Python does not.
LINE_BREAK_LIKE = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"

TRAIN = (
    "import torch  # {c1}\n"
    "model = torch.nn.Linear(2, 1)\n"
    "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
    "losses = []\n"
    "note = \"{s1}\"\n"
    "for step in range(3):\n"
    "    # {c2}\n"
    "    opt.zero_grad()\n"
    "    loss = model(torch.randn(4, 2)).sum()  # {c3}\n"
    "    loss.backward()\n"
    "    opt.step()\n"
    "    losses.append(loss){tail}\n"
)
BROKEN, FIXED = "losses.append(loss)", "losses.append(loss.item())"


def train(c1="", s1="", c2="", c3="", tail="", newline="\n"):
    return TRAIN.format(c1=c1, s1=s1, c2=c2, c3=c3, tail=tail).replace("\n", newline)


def test_split_lines_breaks_only_where_python_does():
    text = "a\x0cb\u2028c\r\nd\re\nf"
    assert split_lines(text) == ["a\x0cb\u2028c", "d", "e", "f"]
    assert "".join(split_lines(text, keepends=True)) == text
    assert split_lines("x\n") == ["x"] and split_lines("") == []
    assert line_starts("ab\r\ncd\ref") == [0, 0, 4, 7, 9]
    assert normalize_newlines("a\r\nb\rc\n") == "a\nb\nc\n"


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "torchgradlint", "check", "--no-cache", *args],
                          capture_output=True, text=True, cwd=cwd)


def test_fix_lands_on_the_flagged_call_after_a_form_feed_comment(tmp_path):
    """0.1.0 rewrote ``losses.append(loss)`` into ``losses.aploss.item()(loss)``."""
    target = tmp_path / "train.py"
    source = train(c2="note \x0c here")
    target.write_text(source, newline="")
    out = cli("--fix", str(target))
    assert out.returncode == 0, out.stdout + out.stderr
    assert target.read_bytes().decode() == source.replace(BROKEN, FIXED)
    again = cli("--fix", str(target))
    assert again.returncode == 0 and target.read_bytes().decode() == source.replace(BROKEN, FIXED)


@pytest.mark.parametrize("char", list(LINE_BREAK_LIKE))
def test_noqa_is_read_from_the_reported_line(char):
    source = train(c1=f"x{char}y", c2=f"x{char}y", tail="  # noqa: TGL101")
    assert [d.code for d in lint_source(source, "t.py", all_rules()).diagnostics] == []
    # the noqa one line below the finding must not silence it
    shifted = train(c1=f"x{char}y", c2=f"x{char}y") + "# noqa: TGL101\n"
    assert [d.code for d in lint_source(shifted, "t.py", all_rules()).diagnostics] == ["TGL101"]


@pytest.mark.slow
def test_cli_and_flake8_agree_on_noqa(tmp_path):
    target = tmp_path / "train.py"
    target.write_text(train(c1="a\x1cb", c2="\u2028", tail="  # noqa: TGL101"), newline="")
    flake = subprocess.run([sys.executable, "-m", "flake8", "--isolated", "--select", "TGL", str(target)],
                           capture_output=True, text=True)
    assert flake.returncode == 0 and flake.stdout == ""
    assert cli(str(target)).returncode == 0
    target.write_text(train(c1="a\x1cb", c2="\u2028"), newline="")
    flake = subprocess.run([sys.executable, "-m", "flake8", "--isolated", "--select", "TGL", str(target)],
                           capture_output=True, text=True)
    check = cli(str(target))
    assert flake.stdout.split(":")[1] == check.stdout.split(":")[1] == "12"


def test_full_output_shows_the_reported_line():
    source = train(c1="\x85", c2="\u2029 and \x0b")
    diags = lint_source(source, "t.py", all_rules()).diagnostics
    ctx = RenderContext(sources={"t.py": source})
    text = renderer("full")(diags, ctx)
    assert "\n12 |     losses.append(loss)\n   |     ^^^^^^^^^^^^^^^^^^^ loss-kept-with-graph\n" in text


def test_line_separator_inside_a_notebook_string_is_not_a_parse_error(tmp_path):
    cell = split_lines(train(s1="loss\u2028curve"), keepends=True)
    nb = {"cells": [{"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": cell}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "nb.ipynb"
    path.write_text(json.dumps(nb, ensure_ascii=False), encoding="utf-8")
    out = cli(str(path))
    assert out.returncode == 1 and out.stdout.startswith(f"{path}:cell 1:12:5: TGL101 "), out.stdout


def test_fixture_expectations_count_lines_as_python_does(tmp_path):
    from torchgradlint.fixture_spec import load_fixtures

    rule_dir = tmp_path / "TGL101"
    rule_dir.mkdir()
    (rule_dir / "bad_x.py").write_text(train(c2="\x0c", tail="  # expect: TGL101"), newline="")
    (fixture,) = load_fixtures(tmp_path)
    assert fixture.expected == frozenset({("TGL101", 12)})


# ---- fuzz: fixes stay in place, are idempotent, touch no other byte ----

filler = st.text(alphabet=LINE_BREAK_LIKE + "ab #\t'", max_size=6)
ENCODINGS = [("utf-8", ""), ("utf-8-sig", ""), ("latin-1", "# -*- coding: latin-1 -*-\n"),
             ("cp1252", "# coding: cp1252\n")]


def encoded(text, encoding, cookie, newline):
    return (cookie + text).replace("\n", newline).encode(encoding)


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(c1=filler, s1=filler, c2=filler, c3=filler, newline=st.sampled_from(["\n", "\r\n", "\r"]),
       enc=st.sampled_from(ENCODINGS), accent=st.sampled_from(["", "é", "€ ü"]))
def test_fuzzed_fix_stays_in_place_and_is_idempotent(tmp_path, c1, s1, c2, c3, newline, enc, accent):
    encoding, cookie = enc
    if encoding == "latin-1" and "€" in accent:
        accent = "ü"
    def fit(part):  # what the encoding can hold (latin-1 and cp1252 have no U+2028, cp1252 no NEL)
        return "".join(ch for ch in part if ch.encode(encoding, "ignore"))

    text = train(c1=fit(c1 + accent), s1=fit(s1 + accent), c2=fit(c2), c3=fit(c3))
    path = tmp_path / "fuzz.py"
    data = encoded(text, encoding, cookie, newline)
    path.write_bytes(data)
    outcome = fix_file(str(path), all_rules())
    assert path.read_bytes() == encoded(text.replace(BROKEN, FIXED), encoding, cookie, newline)
    assert [d.code for d in outcome.applied] == ["TGL101"] and outcome.remaining == []
    again = fix_file(str(path), all_rules())
    assert again.applied == [] and path.read_bytes() == encoded(text.replace(BROKEN, FIXED), encoding, cookie,
                                                                newline)


FIXABLE = sorted(p for p in FIXTURES.glob("TGL*/bad_*.py")
                 if any(d.fix is not None for d in lint_source(p.read_text(), p.name, all_rules()).diagnostics))


def test_some_fixture_is_fixable():
    assert FIXABLE


@pytest.mark.parametrize("fixture", FIXABLE, ids=lambda p: p.name)
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
@pytest.mark.parametrize("encoding,cookie", ENCODINGS)
def test_fix_keeps_bom_encoding_and_line_endings_of_fixtures(tmp_path, fixture, newline, encoding, cookie):
    text = fixture.read_text()
    plain = tmp_path / "plain.py"
    plain.write_text(text, encoding="utf-8", newline="")
    assert fix_file(str(plain), all_rules()).applied
    fixed_text = plain.read_bytes().decode()
    # the same fixture with an accented comment, in the variant's encoding, BOM and line endings
    variant = tmp_path / "variant.py"
    variant.write_bytes(encoded(text + "# café\n", encoding, cookie, newline))
    fix_file(str(variant), all_rules())
    assert variant.read_bytes() == encoded(fixed_text + "# café\n", encoding, cookie, newline)


def test_a_fix_the_encoding_cannot_represent_leaves_the_file_alone():
    data = "# coding: latin-1\nx = 'é'\n".encode("latin-1")
    with pytest.raises(UnfixableFile):
        encode_like("# coding: latin-1\nx = '€'\n", data)
    assert encode_like("# coding: latin-1\nx = 'ü'\n", data)[1] == "# coding: latin-1\nx = 'ü'\n".encode("latin-1")


def test_language_server_noqa_action_lands_on_the_reported_line(tmp_path):
    pytest.importorskip("pygls")
    from lsprotocol import types

    from test_server import run as run_server

    source = train(c1="\u2028", c2="a\x0cb")

    async def scenario(s):
        uri = s.open(tmp_path / "train.py", source)
        (d,) = [x for x in (await s.next_diagnostics(uri)).diagnostics if x.code == "TGL101"]
        assert d.range.start.line == 11
        actions = await s.client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri), range=d.range,
            context=types.CodeActionContext(diagnostics=[d])))
        (nedit,) = next(a for a in actions if a.title.startswith("Add")).edit.changes[uri]
        end_of_line = len("    losses.append(loss)")
        assert (nedit.range.start.line, nedit.range.start.character) == (11, end_of_line)

    run_server(scenario, tmp_path)
