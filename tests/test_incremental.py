"""Incremental parsing (``torchgradlint.incremental``): the joined module is
the whole-file parse, node for node, for every text and every sequence of
edits; unchanged top-level statements are not parsed again."""

import random
from pathlib import Path

import libcst as cst
import pytest

from torchgradlint.engine import lint_source, parse_module
from torchgradlint.incremental import IncrementalParser, split_top_level
from torchgradlint.prefilter import python_ast
from torchgradlint.registry import all_rules

from fuzzing import FIXTURE_TEXTS, mutate

ROOT = Path(__file__).resolve().parent.parent


def _whole(source):
    try:
        return parse_module(source)
    except cst.ParserSyntaxError:
        return None


def assert_same_as_whole(parser, source):
    """``parser`` gives ``source`` the module the whole-file parse gives
    (or raises where it raises)."""
    whole = _whole(source)
    if whole is None:
        with pytest.raises(cst.ParserSyntaxError):
            parser.parse(source, python_ast(source))
        return
    joined = parser.parse(source, python_ast(source))
    assert joined.deep_equals(whole)
    assert joined.code == whole.code
    for field in ("default_indent", "default_newline", "has_trailing_newline", "encoding"):
        assert getattr(joined, field) == getattr(whole, field), field


TRICKY = {
    "indented comments after a simple statement": "x = 1\n    # a\n    # b\n\ny = 2\n",
    "indented comments at the end": "x = 1\ny = 2\n    # a\n    # b\n",
    "whitespace-only tail": "import a\nimport b\n      \n      ",
    "whitespace-only line between statements": "import a\n   \nimport b\n",
    "block footer comments": "def f():\n    a = 1\n    # trailing\n\n# col 0\n\nclass C:\n    pass\n        # deeper\n"
                             "  # shallower\n\n# end\n",
    "two-space file, first piece without a block": "import os\n\n\ndef f():\n  return 1\n\n\ndef g():\n  return 2\n",
    "indents differ between pieces": "def f():\n    return 1\n\n\ndef g():\n  return 2\n",
    "tabs": "def f():\n\treturn 1\n\n\ndef g():\n\treturn 2\n",
    "one-line suites first": "if x: pass\nelse:\n  y = 1\n\nwhile z:\n    pass\n",
    "elif chain": "if a: b\nelif c:\n   d\nelse: e\n\ndef f():\n   pass\n",
    "decorators": "@a\n@b(\n    1)\ndef f():\n    pass\n\n\n@c\nclass C:\n    x = 1\n",
    "statements on one line": "a = 1; b = 2\nc = 3; d = 4\n",
    "header and footer": "#!/usr/bin/env python\n# header\n\n'''doc'''\nimport x\n\n# footer\n",
    "no trailing newline": "import a\nx = 1",
    "backslash continuation": "x = 1 + \\\n    2\ny = 3\n",
    "match": "match x:\n    case 1:\n        pass\n\nimport y\n",
    "try": "try:\n    a()\nexcept E:\n    b()\nfinally:\n    c()\nz = 1\n",
    "form feed": "import a\n\x0c\ndef f():\n    pass\n",
    "crlf": "import a\r\nimport b\r\n",
    "syntax error": "import a\ndef f(:\n    pass\nimport b\n",
    "empty": "",
    "comments only": "# a\n# b\n",
    "multi-line string at top level": "x = '''\n  indented text\n'''\ny = 2\n",
}


@pytest.mark.parametrize("name", sorted(TRICKY))
def test_tricky_texts_parse_as_the_whole_file(name):
    assert_same_as_whole(IncrementalParser(), TRICKY[name])


def _real_texts():
    paths = sorted((ROOT / "fixtures").glob("TGL*/*.py"))
    for folder in (ROOT.parent / "shared" / "shapes", ROOT.parent / "shared" / "devset" / "cases"):
        paths += sorted(folder.glob("*.py"))
    return paths


@pytest.mark.slow
def test_every_fixture_shape_and_dev_set_file_parses_as_the_whole_file():
    paths = _real_texts()
    assert len(paths) > 150
    for path in paths:
        assert_same_as_whole(IncrementalParser(), path.read_text(encoding="utf-8"))


def test_an_edit_parses_only_the_statement_it_changed():
    source = (ROOT / "fixtures" / "TGL001" / "bad_basic_loop.py").read_text()
    pieces = split_top_level(source, python_ast(source))
    assert pieces is not None and len(pieces) >= 4
    units = [len(p.parts) if p.parts else 1 for p in pieces]  # texts parsed per piece
    parser = IncrementalParser()
    assert_same_as_whole(parser, source)
    assert (parser.parsed, parser.reused) == (sum(units), 0)
    # an edit inside the last statement: every other piece (or part of it) is reused
    edited = source.rstrip("\n") + "  # edited\n"
    assert_same_as_whole(parser, edited)
    assert (parser.parsed, parser.reused) == (1, len(pieces) - 1 + units[-1] - 1)
    # a new line at the top joins the first piece: the rest is reused
    assert_same_as_whole(parser, "# note\n" + edited)
    assert (parser.parsed, parser.reused) == (1, len(pieces) - 1 + units[0] - 1)


CLASS = """import torch


class Trainer:
    \"\"\"Trains.\"\"\"

    def __init__(self, model):
        self.model = model

    # --- steps ---
    def step(self, x):
        loss = self.model(x).sum()
        loss.backward()
            # a comment deeper than the block, after a method

    @torch.no_grad()
    def evaluate(self, x):
        return self.model(x)

    def fit(self, data):
        for x in data:
            self.step(x)
# the end
"""


def test_an_edit_inside_one_method_of_a_class_parses_that_method():
    parser = IncrementalParser()
    assert_same_as_whole(parser, CLASS)
    first = parser.parsed
    pieces = split_top_level(CLASS, python_ast(CLASS))
    assert len(pieces) == 2 and pieces[1].parts is not None and len(pieces[1].parts) == 4
    edited = CLASS.replace("self.step(x)", "self.step(x * 2)")
    assert_same_as_whole(parser, edited)
    assert (parser.parsed, parser.reused) == (1, first - 1)
    # the comment deeper than the block stays with the method before it: no cut before `evaluate`
    assert not any(part.lstrip().startswith("@torch.no_grad") for part in pieces[1].parts)


def test_a_carriage_return_parses_the_whole_file():
    parser = IncrementalParser()
    assert_same_as_whole(parser, "import a\r\nimport b\r\n")
    assert (parser.parsed, parser.reused) == (1, 0)


@pytest.mark.parametrize("seed", range(12))
def test_random_edit_sequences_parse_as_the_whole_file(seed):
    """One parser through a sequence of edits (lines deleted, duplicated,
    moved, re-indented, cut short; the text truncated): every version,
    parsable or not, parses as the whole file parses it."""
    rng = random.Random(seed)
    text = rng.choice(FIXTURE_TEXTS)
    parser = IncrementalParser()
    for _ in range(15):
        assert_same_as_whole(parser, text)
        text = mutate(text, rng, "    pass  # inserted")


def test_lint_with_an_incremental_parser_finds_what_a_whole_parse_finds():
    rules = list(all_rules())
    parser = IncrementalParser()
    text = "\n".join(FIXTURE_TEXTS[:6])
    assert any(d.code != "TGL000" for d in lint_source(text, "t.py", rules).diagnostics)
    rng = random.Random(7)
    for _ in range(6):
        whole = lint_source(text, "t.py", rules)
        incremental = lint_source(text, "t.py", rules, parser=parser)
        assert incremental.diagnostics == whole.diagnostics
        text = mutate(text, rng, "x = 1")


def test_the_resident_worker_keeps_one_parser_per_document(tmp_path):
    """The language server's worker (``runner._lint_one`` with the
    incremental flag) parses a document's next version incrementally and
    reports what a fresh lint reports; other callers parse whole files."""
    from torchgradlint import runner
    from torchgradlint.engine import lint_data
    from torchgradlint.limits import DEFAULT_BUDGET

    codes = tuple(r.code for r in all_rules())
    path = str(tmp_path / "train.py")
    text = FIXTURE_TEXTS[0]
    runner._DOCUMENT_PARSERS.clear()
    for version in (text, text + "\n# edited\n"):
        data = version.encode()
        outcome = runner._lint_one((path, codes, data, DEFAULT_BUDGET, None, True))
        assert outcome[0] == lint_data(data, path, list(all_rules())).diagnostics
    parser = runner._DOCUMENT_PARSERS[path]
    assert parser.reused > 0 and parser.parsed == 1
    runner._lint_one((str(tmp_path / "other.py"), codes, text.encode(), DEFAULT_BUDGET))
    assert list(runner._DOCUMENT_PARSERS) == [path]


def _node_ids(module):
    seen, todo = [], [module]
    while todo:
        node = todo.pop()
        seen.append(id(node))
        todo.extend(node.children)
    return seen


def test_equal_statements_get_trees_of_their_own():
    """Two equal top-level statements, or two equal statements of a block,
    must not share a tree: the analysis and the positions tell nodes apart
    by identity, so a shared node would put the second finding on the
    first's line."""
    loop = ("for x in data:\n    loss = model(x).sum()\n    loss.backward()\n    optimizer.step()\n\n")
    source = "import torch\n\n" + loop + loop + "def main():\n    step()\n    step()\n\n    step()\n" + loop
    parser = IncrementalParser()
    for version in (source, source + "# edited\n"):
        module = parser.parse(version, python_ast(version))
        ids = _node_ids(module)
        assert len(ids) == len(set(ids))
        assert module.deep_equals(parse_module(version))
    rules = list(all_rules())
    found = lint_source(source, "t.py", rules, parser=IncrementalParser()).diagnostics
    assert found == lint_source(source, "t.py", rules).diagnostics
    assert len({d.line for d in found if d.code == "TGL001"}) == 3
