"""The documentation stays true and short: README.md's length, the tests' independence from the benchmark
harness, the builder reference against the Kernel class, the README's example file and Python tour,
and every command shown in README.md, docs/ and rules/README.md run as written (GPU ones skipped)."""
from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from cbrules import cli
from cbrules.ir.builder import Kernel

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "rules" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_LIMIT = 300


# ---- guards


def test_the_readme_stays_short():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_LIMIT, f"README.md has {lines} lines (at most {README_LIMIT}): move detail to docs/"


def test_the_readmes_test_command_is_the_one_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci.startswith("python3 -m venv .venv && ") and f"\n    {ci}\n" in (ROOT / "README.md").read_text()


def _imports_benchmarks(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
        found += [n for n in names if n == "benchmarks" or n.startswith("benchmarks.")]
    return found


def test_no_test_imports_the_benchmark_harness():
    offenders = {p.name: _imports_benchmarks(p.read_text()) for p in (ROOT / "tests").rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}, "tests must not import benchmarks/ (the harness)"
    assert _imports_benchmarks("import os\nfrom benchmarks.ops import OPS\n") == ["benchmarks.ops"]
    assert _imports_benchmarks("def f():\n    import benchmarks\n") == ["benchmarks"]


# ---- the builder reference


def _reference() -> dict[str, str]:
    """name -> the argument text of each ``- `k.name(...)` `` line of docs/building.md's reference."""
    text = (ROOT / "docs" / "building.md").read_text().split("## Builder reference", 1)[1]
    entries = re.findall(r"^- `k\.(\w+)\((.*?)\)` — \S", text, re.M)
    names = [n for n, _ in entries]
    assert len(names) == len(set(names)), "a method is listed twice"
    return dict(entries)


def _public_methods() -> dict[str, inspect.Signature]:
    return {n: inspect.signature(getattr(Kernel, n)) for n in dir(Kernel)
            if not n.startswith("_") and callable(getattr(Kernel, n))}


def test_the_builder_reference_lists_every_public_method():
    listed, public = set(_reference()), set(_public_methods())
    assert not public - listed, f"missing from docs/building.md's builder reference: {sorted(public - listed)}"
    assert not listed - public, f"listed in docs/building.md but not Kernel methods: {sorted(listed - public)}"


def test_the_reference_names_the_parameters_the_methods_take():
    methods = _public_methods()
    for name, args in _reference().items():
        params = methods[name].parameters
        free = any(p.kind is p.VAR_KEYWORD for p in params.values())
        variadic = any(p.kind is p.VAR_POSITIONAL for p in params.values())
        for arg in (a.strip() for a in args.split(",") if a.strip()):
            word = arg.lstrip("*").split("=")[0].strip()
            if "=" in arg and not free:
                assert word in params, f"k.{name}: the reference names {word}=, which it does not take"
            elif "=" not in arg and not arg.startswith("*") and not variadic:
                assert word in params, f"k.{name}: the reference names {word}, which it does not take"


def test_a_missing_method_would_be_caught():
    assert "mma" in _reference() and "mma" in _public_methods() and "graph" not in _public_methods()


# ---- the README's example and tour


def _marked_blocks(text: str, mark: str) -> dict[str, str]:
    return dict(re.findall(r"<!-- " + mark + r": (\S+) -->\n```[a-z]*\n(.*?)```", text, re.S))


def test_the_readmes_kernel_file_is_the_example_file():
    (path, code), = _marked_blocks((ROOT / "README.md").read_text(), "file").items()
    assert (ROOT / path).read_text() == code


def test_the_readmes_python_tour_runs_without_a_gpu(monkeypatch, capsys):
    code = _marked_blocks((ROOT / "README.md").read_text(), "python")["tour"]
    monkeypatch.chdir(ROOT)
    from cbrules.codegen import runtime
    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    exec(compile(code, "README.md (tour)", "exec"), {})
    out = capsys.readouterr().out
    assert "9 trip counts: 9 ok, 0 failed" in out and "compiled, not run" in out


@pytest.mark.gpu
def test_the_readmes_python_tour_launches_on_a_gpu(monkeypatch, capsys):
    code = _marked_blocks((ROOT / "README.md").read_text(), "python")["tour"]
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md (tour)", "exec"), {})
    err = float(re.search(r"max error (\S+)", capsys.readouterr().out).group(1))
    assert err < 1e-4  # float32 exp and log on the device against numpy


# ---- the commands, as written

GPU_COMMANDS = ("run", "demo", "tune")


def _shown() -> list[tuple[str, str, list[str]]]:
    """(file, command, the output lines shown under it) of every ``$ cbrules ...`` line."""
    found = []
    for f in DOCS:
        for block in re.findall(r"```[a-z]*\n(.*?)```", f.read_text(), re.S):
            lines = block.splitlines()
            for i, line in enumerate(lines):
                if line.startswith("$ cbrules "):
                    shown = []
                    for nxt in lines[i + 1:]:
                        if nxt.startswith("$ "):
                            break
                        shown.append(nxt.rstrip())
                    found.append((f.relative_to(ROOT).as_posix(), line[2:], shown))
    return found


def _mentioned() -> list[tuple[str, str]]:
    """(file, command) of every complete ``cbrules ...`` command in backticks or on an indented line
    (those with placeholders such as KERNEL or [--options] are descriptions, not commands)."""
    found = []
    for f in DOCS:
        text = f.read_text()
        cmds = re.findall(r"`((?:\.venv/bin/)?cbrules [^`]+)`", text)
        cmds += re.findall(r"^    ((?:\.venv/bin/)?cbrules .*|python3 benchmarks/.*)$", text, re.M)
        for c in cmds:
            c = " ".join(c.split(" #")[0].split())
            if re.search(r"\b[A-Z]{2,}\b|[\[\]|]|\.\.\.|\bK\b", c):
                continue
            found.append((f.relative_to(ROOT).as_posix(), c))
    return list(dict.fromkeys(found))


def _pipe(text: str, stage: list[str]) -> str:
    """``grep [-A N] PATTERN`` (a fixed string, ``^`` anchoring it) or ``head -N`` over ``text``."""
    lines = text.splitlines()
    if stage[0] == "head":
        return "\n".join(lines[:int(stage[1].lstrip("-"))])
    assert stage[0] == "grep", stage
    flags = " ".join(stage[1:-1])
    after = int(flags.replace("-A", "").strip() or 0) if "-A" in flags else 0
    pattern = stage[-1]
    hit = (lambda s: s.startswith(pattern[1:])) if pattern.startswith("^") else (lambda s: pattern in s)
    keep = set()
    for i, line in enumerate(lines):
        if hit(line):
            keep.update(range(i, i + after + 1))
    return "\n".join(lines[i] for i in sorted(keep) if i < len(lines))


def _run(command: str) -> tuple[int, str]:
    """Run a documented ``cbrules ...`` command line in this process: (exit code, stdout + stderr)."""
    stages = [shlex.split(part) for part in command.split(" | ")]
    argv = stages[0][1:]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    text = out.getvalue() + err.getvalue()
    for stage in stages[1:]:
        text = _pipe(text, stage)
    return code, text


def _matches(shown: list[str], got: str) -> bool:
    """Every shown line appears, in order, among the output's lines (``...`` matches anything)."""
    lines = [line.rstrip() for line in got.splitlines()]
    at = 0
    for want in shown:
        if want.strip() in ("", "..."):
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")))
        while at < len(lines) and not pattern.fullmatch(lines[at]):
            at += 1
        if at == len(lines):
            return False
        at += 1
    return True


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory holding what the documents' commands name: examples/, and the rule folders
    of the rule guide (its tutorial calls the backoff folder ``mine``)."""
    d = tmp_path_factory.mktemp("docs")
    (d / "examples").symlink_to(ROOT / "examples")
    for name, text in _marked_blocks((ROOT / "rules" / "README.md").read_text(), "file").items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(text)
    (d / "mine").symlink_to(d / "backoff")
    return d


@pytest.mark.parametrize("where, command, shown", _shown(), ids=[f"{w}: {c}"[:90] for w, c, _ in _shown()])
def test_a_shown_command_prints_what_is_shown(workdir, monkeypatch, where, command, shown):
    if command.split()[1] in GPU_COMMANDS:
        pytest.skip(f"{where}: `{command}` needs a Hopper GPU (the GPU suite runs it)")
    monkeypatch.chdir(workdir)
    code, got = _run(command)
    failing = any(re.search(r"\b[1-9]\d* failed\b", line) for line in shown)
    assert code == (1 if failing else 0), f"{where}: `{command}` exited {code}:\n{got[-3000:]}"
    assert _matches(shown, got), f"{where}: `{command}` no longer prints what is shown:\n{got[-3000:]}"


@pytest.mark.parametrize("where, command", _mentioned(), ids=[f"{w}: {c}"[:90] for w, c in _mentioned()])
def test_a_mentioned_command_runs(workdir, monkeypatch, where, command):
    words = shlex.split(command)
    if words[0].endswith("cbrules") and words[1] in GPU_COMMANDS:
        pytest.skip(f"{where}: `{command}` needs a Hopper GPU")
    if words[0] == "python3":
        if "--from-json" not in words and "--dry-run" not in words:
            pytest.skip(f"{where}: `{command}` measures (a Hopper GPU with torch and Triton, or minutes of CPU)")
        r = subprocess.run([sys.executable, *words[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"{where}: `{command}`: {r.stderr[-2000:]}"
        return
    monkeypatch.chdir(workdir)
    try:
        cli.parser().parse_args(words[1:])
    except SystemExit:
        assert len(words) <= 3, f"{where}: `{command}` is not a command line cbrules takes"
        return  # a command's name in prose (`cbrules check`), not a command line
    code, got = _run(" ".join(shlex.quote(w) for w in words))
    assert code == 0, f"{where}: `{command}` exited {code}:\n{got[-3000:]}"


# ---- links between the documents


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


PENDING: set = set()  # pages linked ahead of the change that writes them


def test_every_relative_link_leads_somewhere():
    broken = []
    for f in DOCS + [ROOT / "benchmarks" / "FINDINGS.md"]:
        text = re.sub(r"```.*?```", "", f.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if dest.relative_to(ROOT).as_posix() in PENDING:
                continue
            if not dest.exists():
                broken.append(f"{f.relative_to(ROOT)}: {target}")
            elif anchor and dest.suffix == ".md":
                heads = {_slug(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
                if anchor not in heads:
                    broken.append(f"{f.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
