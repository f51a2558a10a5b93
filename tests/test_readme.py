"""Every command README.md and the documentation site (docs/**/*.md) show is run, so neither can
drift from the code.

The commands are read from the pages' ``sh`` blocks (one per line, ``&&`` chains split, trailing
comments dropped; a command shown on several pages is checked once) and from their shell
transcripts (``$ command`` then the exact output). Each is checked by the rule of its program
(:data:`RULES`), one of three ways:

* **run** — executed, with overrides that keep it to seconds (fewer requests, a private ``--out``,
  one job, the catalog's tiny model for a CPU calibration); it must exit 0;
* **parse** — its arguments go through the real argument parser only, because it needs a GPU, a
  Ray cluster, or minutes of CPU (the reason is part of the rule and shown in the test id);
* **setup** — environment set-up (``venv``, ``pip install``, the test suite, the docs build): what
  it names must exist (the extras in pyproject.toml, the pinned torch version when torch is
  installed, mkdocs.yml).

A command no rule matches fails the test: add a rule when adding a command. tests/test_docs.py
checks the rest of the pages (the Python API page's code, module paths, the site's structure).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from simulator.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = (README, *sorted(DOCS.rglob("*.md")))  # README first: a command's test id names its first page
SMALL_NUM_REQUESTS = 50  # every simulated workload is cut to this many requests
# validate: one small source of the published table (the whole table takes ~15 s, --fit minutes):
# vllm-ci simulates 6 of its 12 rows. --fit leaves each source out in turn, so it needs two; with
# redhat-mlperf (no row simulated) the held-out side is empty: this runs the command's path, the
# fit's quality is tests/simulator/commands/validate's business.
VALIDATE_SOURCE = "vllm-ci"
FIT_SOURCES = ("vllm-ci", "redhat-mlperf")
SILICON_FIXTURE = ROOT / "tests" / "data" / "silicon" / "silicon_sample_rows.csv"  # nine sample rows
# fidelity's documented exit statuses (backend/cli.py): 0 every target met, 3 one missed,
# 4 some target could not be judged; 8 requests on a busy CPU can give any of them
FIDELITY_RAN = (0, 3, 4)


# ----------------------------------------------------------------------------- reading README
@dataclass(frozen=True)
class Command:
    """One command as README shows it: ``env`` assignments, the program and its arguments."""

    text: str  # as written, for messages and test ids
    env: dict[str, str]
    program: str  # the executable's name (``.venv/bin/simulate`` -> ``simulate``)
    args: tuple[str, ...]


def split_commands(line: str) -> list[Command]:
    """A README shell line as commands: ``&&`` splits, comments go, ``VAR=value`` leads are env."""
    tokens = shlex.split(line, comments=True)
    commands, current = [], []
    for token in [*tokens, "&&"]:
        if token != "&&":
            current.append(token)
            continue
        env = {}
        while current and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", current[0]):
            key, _, value = current.pop(0).partition("=")
            env[key] = value
        if current:
            program = Path(current[0]).name
            commands.append(Command(" ".join([*(f"{k}={v}" for k, v in env.items()), *current]),
                                    env, program, tuple(current[1:])))
        current = []
    return commands


def page_blocks(language: str, pages: tuple[Path, ...] = PAGES) -> list[tuple[Path, str]]:
    """(page, text) of the pages' fenced blocks opened with ```` ```language ```` ("" for untyped)."""
    blocks = []
    for page in pages:
        open_as, lines = None, []
        for line in page.read_text(encoding="utf-8").splitlines():
            if not line.startswith("```"):
                lines.append(line)
            elif open_as is None:  # an opening fence names the block's language
                open_as, lines = line[3:].strip(), []
            else:
                if open_as == language:
                    blocks.append((page, "\n".join(lines) + "\n"))
                open_as = None
        assert open_as is None, f"{page.relative_to(ROOT)} ends inside a fenced block"
    return blocks


def readme_blocks(language: str) -> list[str]:
    """The text of README's own fenced blocks of ``language``."""
    return [text for _, text in page_blocks(language, (README,))]


def shown_commands() -> list[Command]:
    """Every command of the pages' ``sh`` blocks, once each, in the order they first appear."""
    found: dict[str, Command] = {}
    for _, block in page_blocks("sh"):
        for line in block.splitlines():
            if line.strip():
                for cmd in split_commands(line):
                    found.setdefault(cmd.text, cmd)
    return list(found.values())


def shown_transcripts() -> list[tuple[str, str]]:
    """(command, expected output) of the pages' untyped blocks that show a ``$ `` prompt."""
    shown: dict[tuple[str, str], None] = {}
    for _, block in page_blocks(""):
        lines = block.splitlines()
        if lines and lines[0].startswith("$ "):
            shown[(lines[0][2:], "\n".join(lines[1:]))] = None
    return list(shown)


# ----------------------------------------------------------------------------- the rules
def with_option(args: list[str], flag: str, value: str | None = None) -> list[str]:
    """``args`` with ``flag`` (and its value) set: replaced where given, appended otherwise."""
    out, i = [], 0
    while i < len(args):
        if args[i] == flag:
            i += 1 if value is None else 2
            continue
        if value is not None and args[i].startswith(flag + "="):
            i += 1
            continue
        out.append(args[i])
        i += 1
    return [*out, flag] if value is None else [*out, flag, value]


def values_of(args: tuple[str, ...] | list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def pin_file_sweep(args: list[str]) -> list[str]:
    """capacity: each single knob the scenario file sweeps and the command does not is pinned
    to its first value (a zipped ``a+b`` knob cannot be set from the command line and stays),
    so "the whole table" runs a few points, not dozens."""
    if "--no-sweep" in args:
        return args
    data = yaml.safe_load((ROOT / args[0]).read_text(encoding="utf-8")) or {}
    swept = {v.partition("=")[0] for v in values_of(args, "--sweep")}
    for knob, values in (data.get("sweep") or {}).items():
        if "+" not in knob and knob not in swept:
            args = [*args, "--sweep", f"{knob}={values[0]}"]
    return args


def run_kvplan(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(argv)
    out, err = capsys.readouterr()
    assert rc == 0, f"kvplan {' '.join(argv)} exited {rc}:\n{err}\n{out[-2000:]}"


def run_process(argv: list[str], env: dict[str, str] | None = None, ok: tuple[int, ...] = (0,)) -> None:
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})
    assert done.returncode in ok, f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr[-3000:]}"


def parse_only(argv: list[str]) -> None:
    """The real parser accepts ``argv`` (argparse exits 2 on anything it rejects)."""
    build_parser().parse_args(argv)


@dataclass(frozen=True)
class Rule:
    """How the commands of one program (and subcommand) are checked."""

    name: str  # shown in the test id: run | parse (why) | setup
    check: Callable[[Command, Path, pytest.CaptureFixture[str]], None]


def check_simulate(cmd: Command, tmp: Path, capsys) -> None:
    args = list(cmd.args[1:] if cmd.program == "kvplan" else cmd.args)
    args = with_option(args, "--num-requests", str(SMALL_NUM_REQUESTS))
    args = with_option(with_option(args, "--out", str(tmp / "out")), "--quiet")
    run_kvplan(["simulate", *args], capsys)
    assert (tmp / "out" / "summary.json").is_file()


def check_size(cmd: Command, tmp: Path, capsys) -> None:
    run_kvplan(list(cmd.args), capsys)


def check_capacity(cmd: Command, tmp: Path, capsys) -> None:
    args = pin_file_sweep(list(cmd.args[1:]))
    args = [*args, "--set", f"workload.num_requests={SMALL_NUM_REQUESTS}"]
    for flag, value in (("--jobs", "1"), ("--out", str(tmp / "out"))):
        args = with_option(args, flag, value)
    for flag in ("--no-plots", "--no-cache", "--quiet"):
        args = with_option(args, flag)
    run_kvplan(["capacity", *args], capsys)
    assert (tmp / "out" / "capacity.csv").is_file()


def check_calibrate_on_cpu(cmd: Command, tmp: Path, capsys) -> None:
    """The quick sweep on the catalog's tiny model: the same flags and code path in seconds."""
    args = with_option(list(cmd.args), "--model", "tiny")
    args = with_option(with_option(args, "--out", str(tmp / "profile.yaml")), "--quiet")
    run_process(["-m", "simulator.cli", *args], {"TRITON_INTERPRET": "1"})
    assert (tmp / "profile.yaml").is_file()


def check_fidelity_on_cpu(cmd: Command, tmp: Path, capsys) -> None:
    args = with_option(with_option(list(cmd.args), "--num-requests", "8"), "--repeats", "1")
    args = with_option(with_option(args, "--out", str(tmp / "out")), "--quiet")
    run_process(["-m", "simulator.cli", *args], {"TRITON_INTERPRET": "1"}, ok=FIDELITY_RAN)
    assert (tmp / "out" / "fidelity.json").is_file()


def check_validate(cmd: Command, tmp: Path, capsys) -> None:
    args = list(cmd.args)
    assert "--write" not in args, "a README command that rewrites the fitted defaults cannot be run here"
    if "--silicon" in args:  # the whole silicon table takes minutes: the test fixture's rows, converted
        from simulator.commands.validate import silicon

        table = tmp / "silicon.csv"
        silicon.write_table(table, silicon.convert(silicon.read_sample(SILICON_FIXTURE)))
        args = with_option(with_option([a for a in args if a != "--silicon"], "--table", str(table)),
                           "--jobs", "1")
    elif "--fit" in args:
        args = [a for a in args if a not in values_of(args, "--source") and a != "--source"]
        args += [x for s in FIT_SOURCES for x in ("--source", s)]
    elif "--source" not in args:
        args += ["--source", VALIDATE_SOURCE]
    args = with_option(with_option(with_option(args, "--out", str(tmp / "out")), "--no-plots"), "--quiet")
    run_kvplan(args, capsys)


def small_run(scenario: str, out: Path, capsys, *extra: str) -> Path:
    """A small ``simulate`` folder for the README commands that read one (``runs/...``)."""
    run_kvplan(["simulate", scenario, "--num-requests", str(SMALL_NUM_REQUESTS), "--out", str(out),
                "--no-plots", "--quiet", *extra], capsys)
    return out


def check_export(cmd: Command, tmp: Path, capsys) -> None:
    args = list(cmd.args)
    target = args[1]
    if Path(target).parts[:1] == ("runs",):  # a run folder README's reader made with simulate first
        # (made here: the tests never read the checkout's runs/, whatever a user left in it)
        args[1] = str(small_run(f"scenarios/{Path(target).name}.yaml", tmp / "run", capsys))
    run_kvplan(with_option(args, "--out", str(tmp / "out")), capsys)
    assert (tmp / "out" / "serve.sh").is_file() and (tmp / "out" / "bench.sh").is_file()


def check_compare(cmd: Command, tmp: Path, capsys) -> None:
    args = list(cmd.args)
    if "--against" not in args:  # two run folders README's reader made with simulate first
        a, b = args[1:3]
        args[1] = str(small_run("scenarios/chat.yaml", tmp / Path(a).name, capsys))
        args[2] = str(small_run("scenarios/chat.yaml", tmp / Path(b).name, capsys,
                                "--set", "kv_cache_dtype=fp8"))
    run_kvplan(with_option(with_option(args, "--out", str(tmp / "out")), "--quiet"), capsys)
    assert (tmp / "out" / "compare.json").is_file()


def check_calibrate_from_results(cmd: Command, tmp: Path, capsys) -> None:
    run_kvplan(with_option(list(cmd.args), "--out", str(tmp / "calibrated.yaml")), capsys)
    assert (tmp / "calibrated.yaml").is_file()


def check_parse(cmd: Command, tmp: Path, capsys) -> None:
    parse_only(list(cmd.args) if cmd.program == "kvplan" else [cmd.program, *cmd.args])


def check_benchmark_small(cmd: Command, tmp: Path, capsys) -> None:
    script = cmd.args[0]
    args = list(cmd.args)
    if script.endswith("allocator.py"):
        args = with_option(with_option(args, "--requests", "200"), "--repeats", "1")
    elif script.endswith("gpu_check.py"):
        assert "--dry-run" in args
        args = with_option(args, "--results-dir", str(tmp / "results"))
        args = with_option(args, "--work-dir", str(tmp / "w"))
    run_process(args)


def check_benchmark_help(cmd: Command, tmp: Path, capsys) -> None:
    run_process([cmd.args[0], "--help"])


def check_venv(cmd: Command, tmp: Path, capsys) -> None:
    assert cmd.args[:2] == ("-m", "venv") and importlib.util.find_spec("venv") is not None


def check_pip_install(cmd: Command, tmp: Path, capsys) -> None:
    from packaging.requirements import Requirement
    from packaging.version import Version

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert cmd.args[0] == "install"
    for arg in cmd.args[1:]:
        if arg == "-e":
            continue
        if arg.startswith("."):  # the project itself, with its extras
            named = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", arg)
            assert named, arg
            for extra in filter(None, (named.group(1) or "").split(",")):
                assert extra in extras, f"pip install names extra '{extra}', pyproject has {sorted(extras)}"
            continue
        req = Requirement(arg)
        if req.name == "torch" and importlib.util.find_spec("torch") is not None:
            import torch

            installed = Version(torch.__version__)
            assert req.specifier.contains(installed, prereleases=True), (str(req), str(installed))


def check_test_suite(cmd: Command, tmp: Path, capsys) -> None:
    """The suite itself (this test is part of it): its test paths and runner exist."""
    assert cmd.args[:2] == ("-m", "pytest") and importlib.util.find_spec("pytest") is not None
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert all((ROOT / path).is_dir() for path in config["testpaths"])


def check_docs_build(cmd: Command, tmp: Path, capsys) -> None:
    """``mkdocs build``: the site's configuration is there (.ci/run builds the site, --strict)."""
    assert cmd.args[:1] == ("build",) and "--strict" in cmd.args
    assert (ROOT / "mkdocs.yml").is_file() and (DOCS / "hooks" / "reference.py").is_file()


def rule_for(cmd: Command) -> Rule | None:
    """The rule that checks ``cmd`` (None: no rule, which fails the test)."""
    words = cmd.args
    device = values_of(words, "--device")
    if cmd.program == "simulate" or (cmd.program == "kvplan" and words[:1] == ("simulate",)):
        return Rule("run", check_simulate)
    if cmd.program == "kvplan" and words:
        sub = words[0]
        if sub == "size":
            return Rule("run", check_size)
        if sub == "capacity":
            if "ray" in values_of(words, "--executor"):
                return Rule("parse (needs a Ray cluster at --address)", check_parse)
            return Rule("run", check_capacity)
        if sub == "calibrate" and "--from-results" in words:
            return Rule("run", check_calibrate_from_results)
        if sub in ("calibrate", "fidelity") and any(d.startswith("cuda") for d in device):
            return Rule("parse (needs a CUDA GPU)", check_parse)
        if sub == "calibrate" and device == ["cpu"]:
            return Rule("run", check_calibrate_on_cpu)
        if sub == "fidelity" and device == ["cpu"]:
            return Rule("run", check_fidelity_on_cpu)
        if sub == "validate":
            return Rule("run", check_validate)
        if sub == "export":
            return Rule("run", check_export)
        if sub == "compare":
            return Rule("run", check_compare)
    if cmd.program in ("python", "python3") and words[:2] == ("-m", "venv"):
        return Rule("setup", check_venv)
    if cmd.program in ("python", "python3") and words[:2] == ("-m", "pytest"):
        return Rule("setup (the test suite itself)", check_test_suite)
    if cmd.program == "pip":
        return Rule("setup", check_pip_install)
    if cmd.program == "mkdocs":
        return Rule("setup (the docs build: .ci/run builds the site)", check_docs_build)
    if cmd.program in ("python", "python3") and words and words[0].startswith("benchmarks/"):
        script = Path(words[0]).name
        if script == "kernel.py" or (script == "gpu_check.py" and "--dry-run" not in words):
            return Rule("parse (needs a CUDA GPU)", check_benchmark_help)
        # workloads.py: tests/workloads runs it small; capacity.py and startup.py time commands
        if script in ("simulate.py", "workloads.py", "capacity.py", "startup.py"):
            return Rule("parse (times whole traces and 10^6 requests: a benchmark)",
                        check_benchmark_help)
        if script == "parity_vllm.py":
            return Rule("parse (needs vLLM in a venv of its own)", check_benchmark_help)
        if script == "vs_aiconfigurator.py":
            return Rule("parse (needs AIConfigurator in a venv of its own, minutes a run)",
                        check_benchmark_help)
        if script in ("allocator.py", "gpu_check.py"):
            return Rule("run", check_benchmark_small)
    return None


COMMANDS = shown_commands()


def test_the_pages_show_commands() -> None:
    programs = {c.program for c in COMMANDS}
    assert len(COMMANDS) >= 40 and {"simulate", "kvplan", "pip"} <= programs
    readme = {c.text for _, block in page_blocks("sh", (README,)) for line in block.splitlines()
              if line.strip() for c in split_commands(line)}
    assert {"simulate scenarios/chat.yaml", "kvplan capacity scenarios/chat.yaml --allocator paged"} <= readme


def test_ci_installs_what_readme_says() -> None:
    """.ci/run installs the project with README's test command's pip arguments."""
    (line,) = [b for b in readme_blocks("sh") if "pytest" in b]
    (pip,) = [c for c in split_commands(line.strip()) if c.program == "pip"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert f"pip install --quiet {shlex.join(pip.args[1:])}" in ci.replace('"', "'"), pip.args


def _test_id(cmd: Command) -> str:
    rule = rule_for(cmd)
    return f"{rule.name if rule else 'NO RULE'}: {cmd.text}"


@pytest.mark.parametrize("cmd", COMMANDS, ids=[_test_id(c) for c in COMMANDS])
def test_readme_command(cmd: Command, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rule = rule_for(cmd)
    assert rule is not None, f"a command the pages show has no rule in tests/test_readme.py: {cmd.text}"
    rule.check(cmd, tmp_path, capsys)


@pytest.mark.parametrize(("command", "expected"), shown_transcripts())
def test_readme_transcript(command: str, expected: str, tmp_path: Path, monkeypatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    """``$ simulate bad.yaml``: a scenario with the typo the output names gives that exact line."""
    (cmd,) = split_commands(command)
    assert rule_for(cmd) is not None and cmd.program == "simulate"
    scenario = cmd.args[0]
    typo = re.search(r"unknown key '(\w+)' — did you mean '(\w+)'", expected)
    assert typo, expected
    text = (ROOT / "scenarios" / "chat.yaml").read_text()
    assert f"\n{typo.group(2)}:" in text
    (tmp_path / scenario).write_text(text.replace(f"\n{typo.group(2)}:", f"\n{typo.group(1)}:", 1))
    monkeypatch.chdir(tmp_path)
    rc = main(["simulate", *cmd.args])
    assert rc == 2 and capsys.readouterr().err == expected + "\n"


def test_the_annotated_scenario_is_a_valid_scenario(tmp_path: Path) -> None:
    """The annotated scenario the reference shows loads as it is (its workload's trace is bundled)."""
    from simulator.config.scenario import load_scenario

    (example,) = [text for _, text in page_blocks("yaml") if text.startswith("name:")]
    path = tmp_path / "example.yaml"
    path.write_text(example)
    scenario, _ = load_scenario(path)
    assert scenario.name == "chat" and scenario.workload.trace == "bundled:azure-conv"
