#!/usr/bin/env python
"""Diagnostic round-trip of ``torchgradlint server`` after start-up.

Starts the server over stdio with pygls's LanguageClient, opens a training
file (default: about 500 lines made of the rule fixtures; or ``--file``),
waits for its first diagnostics (start-up, imports and the first lint), then
sends ``--edits`` full-text changes (each inserts a comment line, so every
version differs and is linted) one at a time and times, for each, from the
``didChange`` until the ``publishDiagnostics`` of that version arrives.
``--edit-at`` says where the comment goes: ``middle`` (default: the middle
line of the file, indented as that line), ``largest`` (the middle line of
the largest top-level statement: the most the server's incremental parse
must parse again) or ``top`` (the first line: the least).
Prints the median, min and max in milliseconds, and (on Linux) the CPU time
the server and its worker processes spent per edit: on a busy machine the
wall-clock round-trip waits for a core, the CPU time does not.

With ``--compare-src DIR`` (the ``src`` folder of another version, e.g.
``git archive main src | tar -x -C /tmp/main``) it times instead the lint
alone of both versions on the file, each run a fresh process, the versions
alternating ``--alternations`` times, and prints the medians, minima and
their ratio: on a shared machine, a comparison within one run.

Usage::

    python bench/server_latency.py
    python bench/server_latency.py --file path/to/train.py --edits 20
    python bench/server_latency.py --file path/to/train.py --compare-src /tmp/main/src
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from lsprotocol import types
from pygls.lsp.client import LanguageClient

ROOT = Path(__file__).resolve().parent.parent


def training_file(lines: int = 500) -> str:
    """About ``lines`` lines of training code: the fixtures, one after another."""
    parts, n = [], 0
    for path in sorted((ROOT / "fixtures").glob("TGL*/*.py")):
        text = path.read_text()
        parts.append(text)
        n += text.count("\n")
        if n >= lines:
            break
    return "".join(parts)


def tree_cpu_seconds(root: int) -> Optional[float]:
    """User + system CPU seconds of process ``root`` and its descendants
    (from ``/proc``; ``None`` where there is none)."""
    if not os.path.isdir("/proc"):
        return None
    stats: dict[int, tuple[int, float]] = {}  # pid -> (parent, cpu seconds)
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        stats[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += stats.get(pid, (0, 0.0))[1]
        todo.extend(child for child, (parent, _) in stats.items() if parent == pid)
    return total


def edited(text: str, version: int, where: str) -> str:
    """``text`` with the comment line ``# edit <version>`` inserted at ``where``
    (``top``, ``middle`` or ``largest``; see the module's docstring)."""
    import ast

    lines = text.splitlines(keepends=True)
    if where == "top" or not lines:
        return f"# edit {version}\n" + text
    if where == "largest":
        body = ast.parse(text).body
        big = max(body, key=lambda s: (s.end_lineno or s.lineno) - s.lineno)
        at = (big.lineno + (big.end_lineno or big.lineno)) // 2  # 1-based line inside it, after its first
    else:
        at = len(lines) // 2
    line = lines[at - 1] if at else lines[0]
    indent = line[:len(line) - len(line.lstrip(" \t"))]
    return "".join(lines[:at]) + f"{indent}# edit {version}\n" + "".join(lines[at:])


async def measure(text: str, edits: int, where: str = "middle") -> tuple[float, list[float], int, Optional[float]]:
    client = LanguageClient("bench", "1")
    arrived: asyncio.Queue = asyncio.Queue()

    @client.feature(types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    def on_diagnostics(params: types.PublishDiagnosticsParams) -> None:
        arrived.put_nowait((time.perf_counter(), params))

    with tempfile.TemporaryDirectory() as tmp:
        uri = (Path(tmp) / "train.py").as_uri()
        started = time.perf_counter()
        await client.start_io(sys.executable, "-m", "torchgradlint", "server")
        await client.initialize_async(types.InitializeParams(capabilities=types.ClientCapabilities()))
        client.initialized(types.InitializedParams())
        client.text_document_did_open(types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)))
        at, first = await arrived.get()
        startup = at - started
        pid = client._server.pid if client._server is not None else None
        cpu_before = tree_cpu_seconds(pid) if pid else None
        times = []
        for version in range(2, edits + 2):
            new_text = edited(text, version, where)
            sent = time.perf_counter()
            client.text_document_did_change(types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangeWholeDocument(text=new_text)]))
            while True:
                at, params = await arrived.get()
                if params.version == version:
                    break
            times.append((at - sent) * 1000)
        cpu_after = tree_cpu_seconds(pid) if pid else None
        cpu = None if cpu_before is None or cpu_after is None else (cpu_after - cpu_before) * 1000 / edits
        await client.shutdown_async(None)
        client.exit(None)
        await client.stop()
    return startup, times, len(first.diagnostics), cpu


def lint_cpu(text: str, rounds: int, where: Optional[str] = None) -> list[float]:
    """CPU milliseconds of ``engine.lint_source`` on ``text``, parsing the
    whole file each time; with ``where``, on the edit sequence the server
    gets (see :func:`edited`), with one incremental parser as the server's
    worker keeps."""
    from torchgradlint.engine import lint_source
    from torchgradlint.registry import all_rules

    rules = [r for r in all_rules() if r.default_enabled]
    parser = None
    if where is not None:
        from torchgradlint.incremental import IncrementalParser

        parser = IncrementalParser()
    lint_source(text, "train.py", rules, **({"parser": parser} if parser else {}))
    out = []
    for version in range(2, rounds + 2):
        source = text if where is None else edited(text, version, where)
        start = time.process_time()
        lint_source(source, "train.py", rules, **({"parser": parser} if parser else {}))
        out.append((time.process_time() - start) * 1000)
    return out


def compare(text: str, other_src: Path, alternations: int, rounds: int) -> int:
    """Print the lint-alone CPU medians of this version and of ``other_src``,
    each measured in a fresh process, the two alternating."""
    versions = {"this version": dict(os.environ), str(other_src): dict(os.environ, PYTHONPATH=str(other_src))}
    found: dict[str, list[float]] = {name: [] for name in versions}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.py"
        path.write_text(text)
        for i in range(alternations):
            for name in (list(versions) if i % 2 == 0 else list(reversed(versions))):
                out = subprocess.run([sys.executable, __file__, "--lint-alone", str(path), "--edits", str(rounds)],
                                     env=versions[name], capture_output=True, text=True, check=True)
                found[name].append(float(out.stdout.split()[0]))
    medians = {name: statistics.median(v) for name, v in found.items()}
    for name, v in found.items():
        print(f"{name}: lint alone {medians[name]:.1f} ms CPU (median of {len(v)} runs of {rounds} lints; "
              f"min {min(v):.1f})")
    this, other = medians.values()
    print(f"ratio this / other: {this / other:.2f}; load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, help="training file to edit (default: ~500 lines of fixtures)")
    parser.add_argument("--edits", type=int, default=20)
    parser.add_argument("--edit-at", choices=("middle", "largest", "top"), default="middle",
                        help="where each edit inserts its comment line (default: the file's middle line)")
    parser.add_argument("--compare-src", type=Path, help="src folder of another version: compare the lint alone")
    parser.add_argument("--alternations", type=int, default=8)
    parser.add_argument("--lint-alone", type=Path, help=argparse.SUPPRESS)  # one measurement, for --compare-src
    args = parser.parse_args()
    if args.lint_alone:
        print(f"{statistics.median(lint_cpu(args.lint_alone.read_text(), args.edits)):.2f}")
        return 0
    text = args.file.read_text() if args.file else training_file()
    if args.compare_src:
        return compare(text, args.compare_src, args.alternations, args.edits)
    startup, times, found, server_cpu = asyncio.run(measure(text, args.edits, args.edit_at))
    print(f"file: {args.file or 'fixtures'} ({text.count(chr(10))} lines, {found} diagnostics)")
    print(f"start-up to first diagnostics: {startup * 1000:.0f} ms")
    print(f"round-trip over {len(times)} edits at the {args.edit_at}: median {statistics.median(times):.1f} ms, "
          f"min {min(times):.1f} ms, max {max(times):.1f} ms")
    if server_cpu is not None:
        print(f"CPU of the server and its worker per edit: {server_cpu:.1f} ms (mean)")
    print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    cpu = lint_cpu(text, args.edits, args.edit_at)
    whole = lint_cpu(text, args.edits)
    print(f"the lint alone, in this process, on the same edits: median {statistics.median(cpu):.1f} ms CPU "
          f"(a floor for the round-trip that a loaded machine does not move); "
          f"parsing the whole file each time: {statistics.median(whole):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
