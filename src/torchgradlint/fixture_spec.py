"""Fixture files and their inline expectations (no torch needed).

Layout: ``<root>/<CODE>/bad_*.py`` must be flagged and show the defect at run
time; ``<root>/<CODE>/ok_*.py`` must be silent and healthy. A flagged line
carries ``# expect: TGL001`` (several codes: ``# expect: TGL001, TGL101``).
Every fixture defines ``main(device: str, steps: int) -> None``, the entry
point the runtime harness calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .lines import split_lines

EXPECT_RE = re.compile(r"#\s*expect:\s*(TGL\d{3}(?:\s*,\s*TGL\d{3})*)")


@dataclass(frozen=True)
class Fixture:
    """One fixture program.

    ``code``: the rule directory it belongs to; ``kind``: ``"bad"`` or ``"ok"``;
    ``expected``: the ``(code, line)`` pairs its comments promise (1-based).
    """

    path: Path
    code: str
    kind: str
    expected: frozenset[tuple[str, int]]

    @property
    def name(self) -> str:
        """``TGL001/bad_basic_loop``."""
        return f"{self.code}/{self.path.stem}"


def expectations(text: str) -> frozenset[tuple[str, int]]:
    """The ``(code, line)`` pairs promised by ``# expect:`` comments in ``text``."""
    out = set()
    for lineno, line in enumerate(split_lines(text), start=1):
        m = EXPECT_RE.search(line)
        if m:
            for code in m.group(1).split(","):
                out.add((code.strip(), lineno))
    return frozenset(out)


def load_fixtures(root: Path) -> list[Fixture]:
    """Every ``bad_*.py``/``ok_*.py`` under ``root/<CODE>/``, sorted by name.

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a fixtures directory")
    out = []
    for path in sorted(root.glob("*/*.py")):
        kind = path.stem.split("_", 1)[0]
        if kind not in ("bad", "ok"):
            continue
        out.append(Fixture(path, path.parent.name, kind, expectations(path.read_text(encoding="utf-8"))))
    return out
