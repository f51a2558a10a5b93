"""The documentation site (docs/, mkdocs.yml) and README say what the code does.

tests/test_readme.py runs every command the pages show; this file checks the rest:

* the Python API page's ``python`` blocks run, in order, in a fresh folder;
* every module path the pages name (``simulator/...py``, ``backend/...``) exists;
* the reference tables generated at build time (docs/hooks/reference.py) cover every scenario
  key and every command option, and every placeholder of every page renders;
* every page is in mkdocs.yml's nav, every nav entry is a page, README's links and picture exist;
* every ``yaml`` block parses, and a scenario fragment names only scenario keys.

``mkdocs build --strict`` itself runs in .ci/run (it needs the docs extra).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = (README, *sorted(DOCS.rglob("*.md")))
API_PAGE = DOCS / "how-to" / "python-api.md"


def fenced(page: Path, language: str) -> list[str]:
    """The text of ``page``'s fenced blocks opened with ```` ```language ````."""
    return re.findall(rf"^```{re.escape(language)}\n(.*?)^```$", page.read_text(encoding="utf-8"), re.S | re.M)


def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- the Python API page
def test_the_python_api_page_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its blocks, in order, in one namespace, from a fresh folder where scenarios/ is."""
    import matplotlib

    matplotlib.use("Agg")
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    blocks = fenced(API_PAGE, "python")
    assert len(blocks) >= 8
    namespace: dict[str, object] = {"__name__": "python_api_page"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{API_PAGE.name} block {i + 1}", "exec"), namespace)  # noqa: S102
    assert (tmp_path / "allocators.png").is_file()
    assert (tmp_path / "runs" / "chat-small" / "summary.json").is_file()


# ----------------------------------------------------------------------------- module paths
PATH = re.compile(r"(?<![\w./-])((?:simulator|backend|workloads|benchmarks|validation|scenarios|tests)"
                  r"/[\w./-]*[\w/])")
CHECKED = (".py", ".json", ".yaml", ".md", ".csv", ".jsonl", "/")


def named_paths() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for path in PATH.findall(page.read_text(encoding="utf-8")):
            if path.endswith(CHECKED):
                found.append((str(page.relative_to(ROOT)), path))
    return sorted(set(found))


def test_the_pages_name_paths() -> None:
    named = {path for _, path in named_paths()}
    assert "simulator/commands/export/cmd.py" in named and len(named) > 50


@pytest.mark.parametrize(("page", "path"), named_paths())
def test_a_named_path_exists(page: str, path: str) -> None:
    assert (ROOT / path).exists(), f"{page} names {path}, which does not exist"


# ----------------------------------------------------------------------------- generated tables
def test_the_scenario_reference_has_every_key() -> None:
    from simulator.config.scenario import Scenario

    reference = hook()
    table = reference.render("scenario-reference")
    walk = reference.Walk()
    walk.visit(Scenario, "")
    keys = {f"{path}.{name}" if path else name for model in walk.order for path in walk.paths[model][:1]
            for name in model.model_fields}
    assert {"block_size", "workload.arrival.rate", "disaggregation.link.bandwidth_gb_s"} <= keys
    missing = [key for key in sorted(keys) if f"| `{key}` |" not in table]
    assert not missing, f"keys missing from the scenario reference: {missing}"
    assert "max_num_seqs" in reference.render("engine-defaults")


def commands() -> list[str]:
    import tomllib

    from simulator.cli import COMMANDS

    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["kvplan.commands"]
    return [*COMMANDS, *points]


@pytest.mark.parametrize("name", commands())
def test_every_command_has_a_page_with_every_option(name: str) -> None:
    page = DOCS / "reference" / "commands" / f"{name}.md"
    assert page.is_file(), f"no page for command {name}"
    assert f"<!-- generated: command {name} -->" in page.read_text(encoding="utf-8")
    reference = hook()
    text = reference.render(f"command {name}")
    parser = reference.command_parser(name)
    for action in parser._actions:
        for flag in action.option_strings:
            if flag not in ("-h", "--help"):
                assert f"`{flag}" in text, f"{name}: {flag} missing from its options table"


PLACEHOLDER = re.compile(r"^<!-- generated: ([\w .-]+?) -->$", re.M)


def placeholders() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        lines = [line for line in text.splitlines() if line.startswith("<!-- generated:")]
        names = PLACEHOLDER.findall(text)
        assert len(names) == len(lines), f"{page.relative_to(ROOT)}: a placeholder the hook would not read: {lines}"
        found += [(str(page.relative_to(ROOT)), name) for name in names]
    return found


@pytest.mark.parametrize(("page", "name"), placeholders())
def test_every_placeholder_renders(page: str, name: str) -> None:
    assert hook().render(name).strip(), f"{page}: <!-- generated: {name} --> rendered nothing"


def test_an_unknown_placeholder_is_an_error() -> None:
    with pytest.raises(KeyError, match="unknown placeholder"):
        hook().render("scenario-refrence")


# ----------------------------------------------------------------------------- the site's structure
def nav_pages(entries: object) -> list[str]:
    if isinstance(entries, str):
        return [entries]
    if isinstance(entries, list):
        return [p for e in entries for p in nav_pages(e)]
    if isinstance(entries, dict):
        return [p for v in entries.values() for p in nav_pages(v)]
    return []


def test_every_page_is_in_the_nav_and_every_entry_is_a_page() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_pages(config["nav"])
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert sorted(listed) == pages
    assert config["hooks"] == ["docs/hooks/reference.py"] and config["theme"]["font"] is False


def test_readme_links_and_picture_exist() -> None:
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert any(t.endswith(".png") for t in local) and any(t.startswith("docs/") for t in local)
    for target in local:
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    for picture in (t for t in local if t.endswith(".png")):
        assert (ROOT / picture).stat().st_size < 200_000, f"{picture} is over 200 KB"


def test_readme_stays_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 260


# ----------------------------------------------------------------------------- yaml blocks
def yaml_blocks() -> list[tuple[str, str]]:
    return [(str(page.relative_to(ROOT)), block) for page in PAGES for block in fenced(page, "yaml")]


@pytest.mark.parametrize(("page", "block"), yaml_blocks())
def test_a_yaml_block_is_scenario_yaml(page: str, block: str) -> None:
    from simulator.config.scenario import Scenario

    data = yaml.safe_load(block)
    assert isinstance(data, dict), f"{page}: a yaml block that is not a mapping"
    unknown = set(data) - set(Scenario.model_fields)
    assert not unknown, f"{page}: a yaml block with keys a scenario does not have: {sorted(unknown)}"
