"""The fuzzing property shared by ``tests/test_fuzz.py`` (bounded, in CI) and
``scripts/fuzz.py`` (long runs): inputs, and the check each must pass.

Property, for any input text written to a file and linted by the CLI:

- no traceback and no internal error; exit status 0 (clean) or 1 (findings);
- ``--fix`` leaves a file that Python still parses when the input parsed;
- a second ``--fix`` changes nothing (fixes reach a fixed point at once).
"""

from __future__ import annotations

import ast
import contextlib
import io
import random
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_TEXTS = [p.read_text() for p in sorted((ROOT / "fixtures").glob("TGL*/*.py"))]

# Generated programs rarely mention torch: this context makes every rule a
# candidate, so the parser, the analysis and the rules all run on them.
TRAINING_CONTEXT = "import torch\nfor batch in data:\n    loss = model(batch)\n    loss.backward()\n    opt.step()\n"


def parses(text: str) -> bool:
    """Whether CPython parses ``text``."""
    try:
        ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def mutate(text: str, rng: random.Random, extra: str = "") -> str:
    """One random edit of ``text``: a line deleted, duplicated, moved,
    re-indented or cut short, ``extra`` inserted, or the text truncated."""
    lines = text.splitlines(keepends=True) or [""]
    i = rng.randrange(len(lines))
    kind = rng.randrange(7)
    if kind == 0:
        del lines[i]
    elif kind == 1:
        lines.insert(i, lines[i])
    elif kind == 2:
        lines.insert(rng.randrange(len(lines) + 1), lines.pop(i))
    elif kind == 3:
        lines[i] = rng.choice(["", " ", "    ", "\t", "        "]) + lines[i].lstrip(" \t")
    elif kind == 4:
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    elif kind == 5:
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip(" \t"))]
        lines.insert(i, "".join(indent + e + "\n" for e in extra.splitlines()))
    else:
        return text[: rng.randrange(len(text) + 1)]
    return "".join(lines)


def check_text(text: str, folder: Path) -> Optional[str]:
    """Run the property on ``text``; ``None`` when it holds, else what failed."""
    from torchgradlint import cli

    target = folder / "fuzzed.py"
    target.write_text(text, encoding="utf-8", errors="surrogatepass")

    def run(*args: str) -> tuple[int, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = cli.main(["check", "--no-cache", "--jobs", "1", "--isolated", *args, str(target)])
            except BaseException as exc:  # noqa: B036 - any escape is the failure we look for
                return -1, f"{type(exc).__name__}: {exc}"
        return rc, out.getvalue() + err.getvalue()

    rc, output = run()
    if rc not in (0, 1) or "Traceback" in output or "internal error" in output:
        return f"check exited {rc}:\n{output}"
    rc, output = run("--fix")
    if rc not in (0, 1) or "Traceback" in output or "internal error" in output:
        return f"check --fix exited {rc}:\n{output}"
    # Read without newline translation: ``read_text`` turns "\r\n" into "\n", and CPython
    # accepts a backslash continuation before the end of the file after "\r\n" but not after "\n"
    # (a false failure on an unchanged file).
    fixed = target.read_bytes().decode("utf-8", "surrogatepass")
    if parses(text) and not parses(fixed):
        return f"--fix output does not parse:\n{fixed}"
    run("--fix")
    again = target.read_bytes().decode("utf-8", "surrogatepass")
    if again != fixed:
        return "a second --fix changed the file again"
    return None
