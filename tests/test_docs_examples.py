"""Every configuration example in the README and docs/ is valid: each fenced
``toml`` block with a ``[tool.torchgradlint]`` table, written as a
``pyproject.toml``, lints a project without a configuration error (exit 0 or
1, never 2)."""

import re

import pytest

from conftest import FIXTURES, ROOT
from torchgradlint import config
from torchgradlint.cli import main
from snippets import MISSING_ZERO_GRAD

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "usage").glob("*.md"))]
FENCE = re.compile(r"^```toml\n(.*?)^```", re.M | re.S)
# the pyproject examples (other toml, e.g. an editor's languages.toml, is not torchgradlint's config)
BLOCKS = [(path, n, block) for path in DOCS for n, block in enumerate(FENCE.findall(path.read_text()), start=1)
          if "[tool.torchgradlint" in block]


def test_the_docs_have_toml_examples():
    assert {p.name for p, _, _ in BLOCKS} >= {"README.md", "configuration.md"}


@pytest.mark.parametrize("path,n,block", BLOCKS, ids=[f"{p.relative_to(ROOT)}#{n}" for p, n, _ in BLOCKS])
def test_config_example_is_accepted(tmp_path, monkeypatch, capsys, path, n, block):
    (tmp_path / "pyproject.toml").write_text(block)
    (tmp_path / "train.py").write_text(MISSING_ZERO_GRAD)
    monkeypatch.chdir(tmp_path)
    config.clear_cache()
    try:
        code = main(["check", "--no-cache", "."])
    finally:
        config.clear_cache()
    err = capsys.readouterr().err
    assert code in (0, 1), err
    assert "error" not in err


def test_readme_harness_figure_is_the_generated_reports():
    """The README quotes the harness report (docs/harness.md, written by
    ``torchgradlint harness --format markdown``), never a figure of its own."""
    readme = re.search(r"(\d+)/(\d+) fixture runs agree on CPU", " ".join((ROOT / "README.md").read_text().split()))
    report = re.search(r"\*\*(\d+)/(\d+) fixture runs agree\*\*", (ROOT / "docs" / "harness.md").read_text())
    assert readme and report
    assert readme.groups() == report.groups(), f"README.md: write '{report.group(1)}/{report.group(2)} fixture runs'"


def test_readme_names_the_cpu_wheel_index():
    text = (ROOT / "README.md").read_text()
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert 'python -m pytest -q -m "not slow"' in text
