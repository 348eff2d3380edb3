#!/usr/bin/env python
"""Check the incremental parser (``torchgradlint.incremental``) against
LibCST's whole-file parse on real code.

For every ``.py`` file under the given folders (or listed, one path per line,
in a file given with ``--list``) that LibCST parses, the module that
:class:`~torchgradlint.incremental.IncrementalParser` joins from its pieces
must equal ``libcst.parse_module``'s node for node (``deep_equals``), with the
same ``default_indent``, ``default_newline``, ``has_trailing_newline`` and
generated code. Then each file is edited once in the middle of its largest
top-level statement (a comment line inserted, indented as the line it goes
before) and parsed again by the same parser, which must again equal the
whole-file parse, and so must the original text parsed once more (the
edit undone); no node object may sit in two places of a joined module. Prints the counts, how many files were cut (and into how
many texts), and every file that differs; exits 1 if one does.

Usage::

    python realcode/check_incremental_parse.py [DIR ...] [--list FILE]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import libcst as cst  # noqa: E402

from torchgradlint.engine import parse_module  # noqa: E402
from torchgradlint.incremental import IncrementalParser, split_top_level  # noqa: E402
from torchgradlint.prefilter import python_ast  # noqa: E402

FIELDS = ("default_indent", "default_newline", "has_trailing_newline", "encoding")


def distinct_nodes(module: cst.Module) -> bool:
    """Whether no node object sits in two places of ``module`` (the analysis
    tells nodes apart by identity)."""
    seen: set[int] = set()
    todo: list[cst.CSTNode] = [module]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            return False
        seen.add(id(node))
        todo.extend(node.children)
    return True


def same(joined: cst.Module, whole: cst.Module) -> bool:
    """Whether two modules are equal node for node, with the same settings
    and code, and the joined one places each node object once."""
    return joined.deep_equals(whole) and joined.code == whole.code and all(
        getattr(joined, f) == getattr(whole, f) for f in FIELDS) and distinct_nodes(joined)


def edit_middle(source: str, tree: ast.Module) -> str:
    """``source`` with a comment line inserted in the middle of its largest top-level statement."""
    big = max(tree.body, key=lambda s: (s.end_lineno or s.lineno) - s.lineno)
    lines = source.split("\n")
    at = (big.lineno + (big.end_lineno or big.lineno)) // 2
    line = lines[at - 1]
    indent = line[:len(line) - len(line.lstrip(" \t"))]
    return "\n".join(lines[:at] + [indent + "# edited"] + lines[at:])


def check(path: Path) -> tuple[str, int]:
    """``(outcome, texts)``: outcome ``skipped`` (unreadable, or LibCST
    rejects it), ``whole`` (not cut), ``cut`` or ``DIFF ...``; texts: how
    many texts the first parse parsed."""
    try:
        source = path.read_text(encoding="utf-8")
        whole = parse_module(source)
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError, RecursionError):
        return "skipped", 0
    tree = python_ast(source)
    parser = IncrementalParser()
    if not same(parser.parse(source, tree), whole):
        return "DIFF first parse", 0
    texts = parser.parsed
    if tree is not None and tree.body:
        edited = edit_middle(source, tree)
        try:
            whole_edited = parse_module(edited)
        except cst.ParserSyntaxError:  # the comment went into a string with a line continuation
            whole_edited = None
        if whole_edited is not None and not same(parser.parse(edited, python_ast(edited)), whole_edited):
            return "DIFF after an edit", texts
        if not same(parser.parse(source, tree), whole):
            return "DIFF after undoing the edit", texts
    return ("cut" if split_top_level(source, tree) else "whole"), texts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="*", type=Path)
    ap.add_argument("--list", type=Path, help="a file listing .py paths, one per line")
    args = ap.parse_args()
    paths = [p for d in args.dirs for p in sorted(d.rglob("*.py"))]
    if args.list:
        paths += [Path(line.strip()) for line in args.list.read_text().splitlines() if line.strip()]
    counts: dict[str, int] = {}
    texts = 0
    for path in paths:
        outcome, n = check(path)
        counts[outcome.split()[0]] = counts.get(outcome.split()[0], 0) + 1
        texts += n if outcome == "cut" else 0
        if outcome.startswith("DIFF"):
            print(f"{path}: {outcome}")
    print(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())),
          f"(the cut files parsed as {texts} texts)")
    return 1 if counts.get("DIFF") else 0


if __name__ == "__main__":
    sys.exit(main())
