#!/usr/bin/env python
"""Lint real PyTorch code: download the pinned distributions of
``realcode/packages.toml`` into ``.cache/realcode/``, extract them, run the
installed ``torchgradlint check --output-format json`` over each one and
report, per package: files, lines, files that reach the parser, findings per
rule and crashes (exit status 2, "internal error" or a traceback on stderr).

Usage::

    python realcode/lint_real.py                    # download (once), lint, print the table
    python realcode/lint_real.py --check-baseline   # also compare with realcode/baseline.json
    python realcode/lint_real.py --update-baseline  # add new findings (verdict "") and drop vanished ones

``--check-baseline`` exits 1 when a current finding is not in the baseline or
has no verdict, or when any package crashed; it prints new and vanished
findings. Findings are matched on (package, path, line, code).

Downloads use pip (``pip download --no-deps``): sdists with ``--no-binary
:all:``, or a wheel for the entries marked ``kind = "wheel"``; where pip
refuses a release (newer pips reject metadata that no longer parses), the
file with the pinned digest is fetched from PyPI's simple index. Every
archive is checked against its pinned sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

try:
    import tomllib
except ImportError:  # pragma: no cover - Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PACKAGES = HERE / "packages.toml"
BASELINE = HERE / "baseline.json"
DEFAULT_CACHE = ROOT / ".cache" / "realcode"
SKIP_DIRS = {"__pycache__", ".git", ".hg", ".tox", ".venv", "venv", "node_modules"}
# The engine's own decoding and prefilter (both stages), to count the files
# that reach the parser (also used by bench/bench.py).
try:
    from torchgradlint.engine import decode_source
    from torchgradlint.prefilter import candidate_rules
    from torchgradlint.registry import all_rules

    _DEFAULT_RULES = [r for r in all_rules() if r.default_enabled]

    def reaches_parser(data: bytes) -> bool:
        """Whether torchgradlint, with its default rules, parses a file with these bytes."""
        try:
            text = decode_source(data)
        except (UnicodeDecodeError, SyntaxError, LookupError):
            return False
        return bool(candidate_rules(text, _DEFAULT_RULES))
except Exception:  # pragma: no cover - torchgradlint not importable
    def reaches_parser(data: bytes) -> bool:
        """Approximation without torchgradlint: the file mentions torch or backward."""
        return b"torch" in data or b"backward" in data


@dataclass
class Package:
    """One pinned distribution: name, exact version, archive kind and hash."""

    name: str
    version: str
    kind: str = "sdist"  # "sdist" or "wheel"
    sha256: str = ""
    note: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}-{self.version}"


@dataclass
class PackageRun:
    """What one package's lint run produced."""

    package: str
    files: int = 0
    lines: int = 0
    prefiltered: int = 0  # files that pass the engine's prefilter (reach the parser)
    findings: list[dict] = field(default_factory=list)
    parse_errors: int = 0
    exit_code: int = 0
    crash: str = ""
    seconds: float = 0.0


def load_packages(path: Path = PACKAGES) -> list[Package]:
    """The pinned list. Raises ``KeyError`` on an entry without name/version."""
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    return [Package(p["name"], p["version"], p.get("kind", "sdist"), p.get("sha256", ""), p.get("note", ""))
            for p in data["package"]]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _archive(pkg: Package, dl_dir: Path) -> Optional[Path]:
    if not dl_dir.is_dir():
        return None
    found = [p for p in dl_dir.iterdir() if p.suffix in (".gz", ".zip", ".whl", ".bz2", ".tgz")]
    return found[0] if found else None


def _download_pinned_file(pkg: Package, dl_dir: Path) -> Optional[Path]:
    """The release file of ``pkg`` whose sha256 is the pinned one, found in
    PyPI's simple index (PEP 691 JSON) and fetched into ``dl_dir``; ``None``
    when the index cannot be reached or lists no such file."""
    import urllib.request

    request = urllib.request.Request(f"https://pypi.org/simple/{pkg.name}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as fh:
            index = json.load(fh)
        for f in index.get("files", []):
            if f.get("hashes", {}).get("sha256") == pkg.sha256:
                target = dl_dir / f["filename"]
                with urllib.request.urlopen(f["url"], timeout=300) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
                return target
    except (OSError, ValueError, KeyError):
        return None
    return None


def download(pkg: Package, cache: Path, log=print) -> Path:
    """The package's archive in ``cache/downloads/<name>-<version>/`` (pip
    download, once). Raises ``RuntimeError`` when pip fails or the hash differs."""
    dl_dir = cache / "downloads" / pkg.key
    arch = _archive(pkg, dl_dir)
    if arch is None:
        dl_dir.mkdir(parents=True, exist_ok=True)
        kind = ["--only-binary", ":all:"] if pkg.kind == "wheel" else ["--no-binary", ":all:"]
        base = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *kind, "-d", str(dl_dir),
                f"{pkg.name}=={pkg.version}"]
        log(f"  downloading {pkg.name}=={pkg.version} ({pkg.kind})")
        # Without build isolation pip prepares the metadata with the installed
        # setuptools (fast); projects on other backends need isolation.
        for extra in (["--no-build-isolation"], []):
            r = subprocess.run(base[:5] + extra + base[5:], capture_output=True, text=True)
            arch = _archive(pkg, dl_dir)
            if arch is not None:
                break
        if arch is None and pkg.sha256:
            # pip >= 24.1 refuses a distribution whose metadata no longer parses
            # (catalyst 22.4's ``scikit-image (<0.19.0>=0.16.1)``): fetch the file
            # with the pinned digest from PyPI's simple index instead.
            arch = _download_pinned_file(pkg, dl_dir)
        if arch is None:
            raise RuntimeError(f"pip download {pkg.name}=={pkg.version} failed:\n{r.stderr[-2000:]}")
    if pkg.sha256 and _sha256(arch) != pkg.sha256:
        raise RuntimeError(f"{arch}: sha256 {_sha256(arch)} differs from the pinned {pkg.sha256}")
    return arch


def extract(pkg: Package, archive: Path, cache: Path) -> Path:
    """The package's source tree in ``cache/src/<name>-<version>/`` (once);
    for an sdist its single top folder, for a wheel the unzipped tree."""
    dest = cache / "src" / pkg.key
    done = dest / ".extracted"
    if not done.exists():
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        if archive.suffix in (".zip", ".whl"):
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(dest)
        else:
            with tarfile.open(archive) as tf:
                tf.extractall(dest, filter="data")
        done.write_text(archive.name)
    entries = [p for p in dest.iterdir() if p.name != ".extracted"]
    if pkg.kind == "sdist" and len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return dest


def python_files(root: Path) -> list[str]:
    """Every ``*.py`` below ``root`` (relative, sorted), skipping hidden,
    cache and virtual-env folders."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        for f in sorted(filenames):
            if f.endswith(".py"):
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return out


def _count(root: Path, files: list[str]) -> tuple[int, int]:
    lines = pre = 0
    for f in files:
        data = (root / f).read_bytes()
        lines += data.count(b"\n")
        pre += reaches_parser(data)
    return lines, pre


def lint_package(pkg: Package, root: Path, cli: list[str], extra_args: list[str]) -> PackageRun:
    """Run the CLI over the package's files (named explicitly, relative to
    ``root``, so that findings carry package-relative paths)."""
    files = python_files(root)
    run = PackageRun(pkg.name, files=len(files))
    run.lines, run.prefiltered = _count(root, files)
    if not files:
        return run
    t0 = time.perf_counter()
    r = subprocess.run([*cli, "check", "--output-format", "json", *extra_args, *files],
                       cwd=root, capture_output=True, text=True)
    run.seconds = time.perf_counter() - t0
    run.exit_code = r.returncode
    try:
        diags = json.loads(r.stdout or "[]")
    except json.JSONDecodeError:
        diags = []
        run.crash = f"stdout is not JSON: {r.stdout[:500]!r}"
    for d in diags:
        item = {"package": pkg.name, "path": d["filename"].replace(os.sep, "/"),
                "line": d["location"]["row"], "column": d["location"]["column"],
                "code": d["code"], "message": d["message"]}
        if d["code"] == "TGL000":
            run.parse_errors += 1
        run.findings.append(item)
    problems = []
    if r.returncode not in (0, 1):
        problems.append(f"exit status {r.returncode}")
    if "internal error" in r.stderr or "Traceback" in r.stderr:
        problems.append("internal error/traceback on stderr")
    if problems and not run.crash:
        run.crash = "; ".join(problems) + "\n" + r.stderr[-4000:]
    return run


def _key(f: dict) -> tuple:
    return (f["package"], f["path"], f["line"], f["code"])


def compare_baseline(current: list[dict], baseline: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(new, unreviewed, vanished): current findings absent from the baseline,
    present but without a TP/FP verdict, and baseline entries no longer found."""
    base = {_key(b): b for b in baseline}
    cur = {_key(c) for c in current}
    new = [c for c in current if _key(c) not in base]
    unreviewed = [c for c in current if _key(c) in base and base[_key(c)].get("verdict") not in ("TP", "FP")]
    vanished = [b for k, b in base.items() if k not in cur]
    return new, unreviewed, vanished


def update_baseline(current: list[dict], baseline: list[dict]) -> list[dict]:
    """The baseline for ``current``: kept verdicts, new entries unreviewed."""
    base = {_key(b): b for b in baseline}
    out = []
    for c in current:
        old = base.get(_key(c))
        out.append({"package": c["package"], "path": c["path"], "line": c["line"], "code": c["code"],
                    "verdict": old["verdict"] if old else "", "reason": old["reason"] if old else "",
                    "message": c["message"]})
    return sorted(out, key=_key)


def _rule_codes() -> list[str]:
    """Codes of the installed torchgradlint's rules (empty if not importable)."""
    try:
        from torchgradlint.registry import all_rules
        return [r.code for r in all_rules()]
    except Exception:  # pragma: no cover
        return []


def render_markdown(runs: list[PackageRun], baseline: list[dict], packages: list[Package]) -> str:
    """BASELINE.md: counts per package and rule, verdicts per rule, the table."""
    codes = sorted({f["code"] for r in runs for f in r.findings} | {b["code"] for b in baseline} | set(_rule_codes()))
    versions = {p.name: f"{p.version} ({p.kind})" for p in packages}
    out = ["# Real-code baseline", "",
           "Generated by `python realcode/lint_real.py --update-baseline --markdown realcode/BASELINE.md`;",
           "verdicts are reviewed by hand in `realcode/baseline.json` (TP: the defect really happens at run",
           "time; FP: it does not). `python realcode/lint_real.py --check-baseline` fails on any finding",
           "without a verdict.", "",
           "## Counts per package", "",
           "| package | version | files | lines | reach the parser | " + " | ".join(codes) + " | crashes |",
           "|---|---|---:|---:|---:|" + "---:|" * len(codes) + "---:|"]
    for r in runs:
        per = Counter(f["code"] for f in r.findings)
        out.append(f"| {r.package} | {versions.get(r.package, '')} | {r.files} | {r.lines} | {r.prefiltered} | "
                   + " | ".join(str(per.get(c, 0)) for c in codes) + f" | {int(bool(r.crash))} |")
    tot = Counter(f["code"] for r in runs for f in r.findings)
    out.append(f"| **total** | | {sum(r.files for r in runs)} | {sum(r.lines for r in runs)} | "
               f"{sum(r.prefiltered for r in runs)} | " + " | ".join(str(tot.get(c, 0)) for c in codes)
               + f" | {sum(bool(r.crash) for r in runs)} |")
    out += ["", "## Verdicts per rule", "", "| rule | findings | TP | FP | unreviewed |", "|---|---:|---:|---:|---:|"]
    for c in codes:
        items = [b for b in baseline if b["code"] == c]
        v = Counter(b.get("verdict") or "-" for b in items)
        out.append(f"| {c} | {len(items)} | {v.get('TP', 0)} | {v.get('FP', 0)} | {v.get('-', 0)} |")
    out += ["", "## Findings", ""]
    if baseline:
        out += ["| package | path:line | code | verdict | reason |", "|---|---|---|---|---|"]
        for b in baseline:
            out.append(f"| {b['package']} | `{b['path']}:{b['line']}` | {b['code']} | {b.get('verdict') or '-'} | "
                       f"{b.get('reason', '')} |")
    else:
        out.append("No findings.")
    notes = HERE / "review_notes.md"
    if notes.exists():
        out += ["", notes.read_text(encoding="utf-8").rstrip()]
    return "\n".join(out) + "\n"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--packages", type=Path, default=PACKAGES)
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--only", action="append", default=[], help="lint only this package (repeatable)")
    ap.add_argument("--check-baseline", action="store_true", help="fail on findings not reviewed in the baseline")
    ap.add_argument("--update-baseline", action="store_true", help="rewrite the baseline, keeping verdicts")
    ap.add_argument("--show", action="store_true", help="print every finding")
    ap.add_argument("--markdown", type=Path, help="write the human-readable baseline (BASELINE.md) here")
    ap.add_argument("--json", type=Path, help="write the run's results here")
    ap.add_argument("--cli", default=None, help="command to run (default: the installed torchgradlint)")
    ap.add_argument("cli_args", nargs="*", help="extra arguments for 'torchgradlint check' (after --)")
    args = ap.parse_args(argv)

    cli = args.cli.split() if args.cli else [shutil.which("torchgradlint") or "torchgradlint"]
    pkgs = [p for p in load_packages(args.packages) if not args.only or p.name in args.only]
    runs: list[PackageRun] = []
    for pkg in pkgs:
        try:
            root = extract(pkg, download(pkg, args.cache_dir), args.cache_dir)
        except (RuntimeError, OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
            print(f"{pkg.key}: could not fetch: {exc}", file=sys.stderr)
            run = PackageRun(pkg.name, crash=f"download failed: {exc}")
            runs.append(run)
            continue
        runs.append(lint_package(pkg, root, cli, args.cli_args))

    codes = sorted({f["code"] for r in runs for f in r.findings} | set(_rule_codes()))
    head = f"{'package':<26}{'files':>7}{'lines':>9}{'parsed':>8}{'secs':>7}" + "".join(f"{c:>8}" for c in codes) \
        + "  crash"
    print(head)
    print("-" * len(head))
    tot = Counter()
    for r in runs:
        per = Counter(f["code"] for f in r.findings)
        tot.update(per)
        print(f"{r.package:<26}{r.files:>7}{r.lines:>9}{r.prefiltered:>8}{r.seconds:>7.1f}"
              + "".join(f"{per.get(c, 0):>8}" for c in codes) + ("  YES" if r.crash else "  no"))
    print("-" * len(head))
    print(f"{'total':<26}{sum(r.files for r in runs):>7}{sum(r.lines for r in runs):>9}"
          f"{sum(r.prefiltered for r in runs):>8}{sum(r.seconds for r in runs):>7.1f}"
          + "".join(f"{tot.get(c, 0):>8}" for c in codes)
          + f"  {sum(bool(r.crash) for r in runs)} crashed")
    for r in runs:
        if r.crash:
            print(f"\nCRASH in {r.package}:\n{r.crash}", file=sys.stderr)
    current = [f for r in runs for f in r.findings]
    if args.show:
        for f in current:
            print(f"{f['package']}/{f['path']}:{f['line']}:{f['column']}: {f['code']} {f['message']}")
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ for r in runs], indent=1))

    status = 1 if any(r.crash for r in runs) else 0
    baseline = json.loads(args.baseline.read_text()) if args.baseline.exists() else []
    if args.only:  # compare only the packages linted
        baseline = [b for b in baseline if b["package"] in args.only]
    if args.update_baseline:
        args.baseline.write_text(json.dumps(update_baseline(current, baseline), indent=1) + "\n")
        print(f"\nwrote {args.baseline}")
    elif args.check_baseline:
        new, unreviewed, vanished = compare_baseline(current, baseline)
        for title, items in (("new (not in the baseline)", new), ("unreviewed (no verdict)", unreviewed),
                             ("vanished (in the baseline, no longer found)", vanished)):
            if items:
                print(f"\n{title}: {len(items)}")
                for f in items:
                    print(f"  {f['package']}/{f['path']}:{f['line']}: {f['code']} {f.get('message', '')}")
        verdicts = Counter((b["code"], b.get("verdict")) for b in baseline if _key(b) in {_key(c) for c in current})
        print("\nverdicts of current findings: "
              + ", ".join(f"{c} {v}={n}" for (c, v), n in sorted(verdicts.items(), key=str)))
        if new or unreviewed:
            status = 1
    if args.markdown:
        final = json.loads(args.baseline.read_text()) if args.baseline.exists() else []
        args.markdown.write_text(render_markdown(runs, final, pkgs))
        print(f"wrote {args.markdown}")
    return status


if __name__ == "__main__":
    sys.exit(main())
