"""MkDocs hook: the reference tables, generated from the code when the site is built.

A page asks for a table with a placeholder alone on its line::

    <!-- generated: scenario-reference -->   every scenario key: Scenario and the models under it
    <!-- generated: engine-defaults -->      what the knobs a scenario leaves unset become, per GPU
    <!-- generated: command NAME -->         a command's usage and options, from its argparse parser
    <!-- generated: gpu-catalog -->          simulator/kv/gpus.py: the GPUs, with their sources
    <!-- generated: model-catalog -->        simulator/kv/catalog.py: the models
    <!-- generated: roofline-fit -->         simulator/latency/roofline_fit.json: the constants and their errors
    <!-- generated: docstring MODULE -->     a module's docstring, its literal blocks as code

So the tables cannot drift from the code: a new key, flag, GPU or model is on the page at the
next build. The keys' notes are the comments the code carries beside (or right above) each
field, and each row names the line it comes from.

mkdocs.yml lists this file under ``hooks:``. Everything but :func:`on_page_markdown` imports the
project and the standard library only, so tests/test_docs.py calls :func:`render` without MkDocs.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import inspect
import io
import re
import sys
import tokenize
import tomllib
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

ROOT = Path(__file__).resolve().parents[2]

PLACEHOLDER = re.compile(r"^<!-- generated: ([\w .-]+?) -->$", re.M)
USAGE_WIDTH = 88  # columns of the usage lines, whatever the terminal that builds the site


# ----------------------------------------------------------------------------- the hook
def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace each placeholder of the page with its table."""
    def one(match: re.Match[str]) -> str:
        try:
            return render(match.group(1))
        except ImportError as err:
            raise _plugin_error(
                f"{page.file.src_uri}: its tables are generated from kvplan's code, which needs its "
                f"dependencies ({err}): build the site where kvplan is installed, "
                "pip install -e '.[docs]'") from err
        except KeyError as err:
            raise _plugin_error(f"{page.file.src_uri}: {err.args[0]}") from err
    return PLACEHOLDER.sub(one, markdown)


def _plugin_error(message: str) -> Exception:
    from mkdocs.exceptions import PluginError

    return PluginError(message)


def render(name: str) -> str:
    """The markdown of placeholder ``name`` (KeyError for an unknown one)."""
    if str(ROOT) not in sys.path:  # the checkout's code, whatever else the environment has (here,
        sys.path.insert(0, str(ROOT))  # not at import: MkDocs restores sys.path after loading a hook)
    kind, _, arg = name.partition(" ")
    if kind == "command" and arg:
        return command_reference(arg)
    if kind == "docstring" and arg:
        return docstring_markdown(importlib.import_module(arg))
    makers = {"scenario-reference": scenario_reference, "engine-defaults": engine_defaults,
              "gpu-catalog": gpu_catalog, "model-catalog": model_catalog, "roofline-fit": roofline_fit}
    if name not in makers:
        raise KeyError(f"unknown placeholder '<!-- generated: {name} -->' (known: {', '.join(makers)}, command NAME)")
    return makers[name]()


# ----------------------------------------------------------------------------- text helpers
def outside_code(text: str, change: Any) -> str:
    """``text`` with ``change`` applied to what lies outside its code spans."""
    parts = text.split("`")
    return "`".join(change(part) if i % 2 == 0 else part for i, part in enumerate(parts))


def no_html(text: str) -> str:
    """``<name>`` in prose shows as written, not as an HTML tag (code spans escape themselves)."""
    return outside_code(text, lambda part: part.replace("<", "&lt;").replace(">", "&gt;"))


def cell(text: object) -> str:
    """``text`` as one markdown table cell."""
    return no_html(" ".join(str(text).split())).replace("|", "\\|")


FILE_PATH = re.compile(r"(?<![`\w/.])((?:[\w.-]+/)+[\w.-]+\.(?:py|json|yaml|go|rs))(?![`\w])")


def rst_to_md(text: str) -> str:
    """A docstring's or comment's reStructuredText roles and literals as markdown code, and the
    file paths it names as code too (``__init__.py`` is not bold)."""
    text = re.sub(r":(?:mod|func|class|meth|attr|data|exc):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return outside_code(text, lambda part: FILE_PATH.sub(r"`\1`", part))


def docstring_prose(obj: object) -> str:
    """``obj``'s docstring without its ``::`` literal blocks (the tables say the same)."""
    doc = inspect.getdoc(obj) or ""
    kept, skipping = [], False
    for line in doc.splitlines():
        if skipping:
            if line.strip() and not line.startswith(" "):
                skipping = False
            else:
                continue
        if line.rstrip().endswith("::"):
            line = line.rstrip()[:-1].rstrip(":") + ("." if line.rstrip() != "::" else "")
            skipping = True
            if not line.strip(". "):
                continue
        kept.append(line)
    return no_html(rst_to_md("\n".join(kept).strip()))


def docstring_markdown(obj: object, *, skip_summary: bool = True) -> str:
    """``obj``'s docstring as markdown: its ``::`` literal blocks fenced as text, roles as code."""
    lines = (inspect.getdoc(obj) or "").splitlines()
    if skip_summary:  # the page's heading says it
        while lines and lines[0].strip():
            lines.pop(0)
    out: list[str] = []
    prose: list[str] = []
    block: list[str] | None = None

    def flush_prose() -> None:
        out.extend(no_html(rst_to_md("\n".join(prose))).splitlines())
        prose.clear()

    for line in [*lines, ""]:
        if block is not None:
            if line.strip() and not line.startswith(" "):
                out.extend(["```text", *inspect.cleandoc("\n".join(block)).splitlines(), "```", ""])
                block = None
            else:
                block.append(line)
                continue
        if line.rstrip().endswith("::"):
            text = line.rstrip()[:-2].rstrip()
            if text:
                prose.append(text + ":")
            flush_prose()
            out.append("")
            block = []
            continue
        prose.append(line)
    flush_prose()
    if block:
        out.extend(["```text", *inspect.cleandoc("\n".join(block)).splitlines(), "```"])
    return "\n".join(out).strip() + "\n"


def relative(path: str | Path) -> str:
    try:
        return Path(path).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return str(path)


@functools.cache
def comments_of(path: str) -> tuple[dict[int, str], frozenset[int]]:
    """A source file's comments by line, and the lines that hold nothing else."""
    text = Path(path).read_text(encoding="utf-8")
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = text.splitlines()
    alone = frozenset(n for n in comments if lines[n - 1].lstrip().startswith("#"))
    return comments, alone


def comment_at(path: str, first: int, last: int) -> str:
    """The comment of the statement on lines ``first``..``last``: the comment lines right above
    it (up to a blank or code line) and the comments on its own lines."""
    comments, alone = comments_of(path)
    above, line = [], first - 1
    while line in alone:
        above.insert(0, comments[line])
        line -= 1
    inline = [comments[n] for n in range(first, last + 1) if n in comments and n not in alone]
    return " ".join([*above, *inline])


# ----------------------------------------------------------------------------- scenario keys
@functools.cache
def _class_fields(cls: type) -> dict[str, tuple[str, int, int]]:
    """Each field a pydantic model's class body writes: (file, first line, last line)."""
    path = inspect.getsourcefile(cls)
    assert path is not None
    lines, start = inspect.getsourcelines(cls)
    tree = ast.parse(inspect.cleandoc("\n" + "".join(lines)) if lines[0].startswith(" ") else "".join(lines))
    body = tree.body[0]
    assert isinstance(body, ast.ClassDef)
    return {node.target.id: (path, start + node.lineno - 1, start + (node.end_lineno or node.lineno) - 1)
            for node in body.body if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def field_origin(model: type, name: str) -> tuple[str, int, int]:
    """Where field ``name`` of ``model`` (or of the base class that declares it) is written."""
    for cls in model.__mro__:
        found = _class_fields(cls).get(name) if "__pydantic_fields__" in vars(cls) else None
        if found:
            return found
    raise LookupError(f"{model.__name__}.{name}: no source line")


def _is_model(t: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(t, type) and issubclass(t, BaseModel)


def _members(annotation: Any) -> list[Any]:
    """A union's members (Optional included), other annotations as themselves."""
    if get_origin(annotation) in (Union, types.UnionType):
        return list(get_args(annotation))
    return [annotation]


def _bounds(metadata: list[Any]) -> str:
    words = []
    for item in metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            value = getattr(item, attr, None)
            if value is not None and not callable(value):
                words.append(f"{sign} {value:,}" if isinstance(value, int) else f"{sign} {value:g}")
        if getattr(item, "allow_inf_nan", None) is False:
            words.append("finite")
        inner = getattr(item, "metadata", None)  # a FieldInfo inside Annotated
        if inner:
            words.append(_bounds(list(inner)))
    return ", ".join(w for w in words if w)


_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null"}


class Walk:
    """The scenario's models in the order the page shows them, and the paths each is used at."""

    def __init__(self) -> None:
        self.order: list[type] = []
        self.paths: dict[type, list[str]] = {}
        self.tags: dict[type, str] = {}  # a union member: its discriminator, e.g. "dist: fixed"

    def visit(self, model: type, path: str) -> None:
        if model not in self.paths:
            self.order.append(model)
            self.paths[model] = []
        if path in self.paths[model]:
            return
        self.paths[model].append(path)
        for name, field in model.model_fields.items():
            for inner in self.models_in(field.annotation):
                self.visit(inner, f"{path}.{name}" if path else name)

    def models_in(self, annotation: Any) -> list[type]:
        origin = get_origin(annotation)
        if origin is Annotated:
            return self.models_in(get_args(annotation)[0])
        if origin in (Union, types.UnionType):
            found = [m for a in get_args(annotation) for m in self.models_in(a)]
            for m in found:
                tag = _discriminator(m)
                if tag and len(found) > 1:
                    self.tags[m] = tag
            return found
        if origin in (list, tuple, dict):
            return [m for a in get_args(annotation) for m in self.models_in(a)]
        return [annotation] if _is_model(annotation) else []

    def anchor(self, model: type) -> str:
        return "key-" + re.sub(r"[^a-z0-9]+", "-", self.title(model).lower()).strip("-")

    def title(self, model: type) -> str:
        paths = " / ".join(self.paths[model]) or "Top-level keys"
        return f"{paths} ({self.tags[model]})" if model in self.tags else paths

    def describe(self, annotation: Any, metadata: list[Any] = ()) -> str:  # type: ignore[assignment]
        """A field's type in words: ``integer (≥ 1, ≤ 64) or null``, ``mapping (section)``."""
        origin = get_origin(annotation)
        if origin is Annotated:
            base, *extra = get_args(annotation)
            return self.describe(base, [*metadata, *extra])
        if origin in (Union, types.UnionType):
            members = get_args(annotation)
            models = [m for m in members if _is_model(m) or (get_origin(m) is Annotated and _is_model(get_args(m)[0]))]
            if len(models) > 1:  # a discriminated union: one link per variant
                plain = [m if _is_model(m) else get_args(m)[0] for m in models]
                return "mapping, one of: " + ", ".join(
                    f"[`{self.tags.get(m, m.__name__)}`](#{self.anchor(m)})" for m in plain)
            words = [self.describe(m, metadata if m is not type(None) else []) for m in members]
            return " or ".join(dict.fromkeys(words))
        if origin is Literal:
            return "one of " + ", ".join(f"`{v}`" for v in get_args(annotation))
        if origin in (list, tuple):
            args = [a for a in get_args(annotation) if a is not Ellipsis]
            return "list of " + (self.describe(args[0]) if args else "values")
        if origin is dict:
            key, value = get_args(annotation)
            return f"mapping of {self.describe(key)} to {self.describe(value)}"
        if _is_model(annotation):
            return f"mapping ([below](#{self.anchor(annotation)}))"
        if annotation is Any:
            return "any"
        name = _NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))
        bounds = _bounds(list(metadata))
        return f"{name} ({bounds})" if bounds else name


def _discriminator(model: type) -> str:
    for name, field in model.model_fields.items():
        if get_origin(field.annotation) is Literal and field.is_required():
            values = get_args(field.annotation)
            if len(values) == 1:
                return f"{name}: {values[0]}"
    return ""


def yaml_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return value if value else '""'
    return f"{value:g}" if isinstance(value, float) else str(value)


# The knobs simulator.config.deployment.engine_defaults resolves when a scenario leaves them unset.
def _engine_knobs() -> tuple[str, ...]:
    from simulator.config.deployment import EngineKnobs

    return tuple(f for f in EngineKnobs._fields if f != "engine_knobs")


KEY_LINE = re.compile(r"^(\s*)([a-z_]+):\s*(.*?)\s*#\s?(.*)$")
MORE_LINE = re.compile(r"^\s+#\s*(.*)$")


@functools.cache
def docstring_examples(module_name: str) -> dict[str, tuple[str, str]]:
    """The ``key: value  # comment`` lines of a module docstring's literal blocks (its example
    scenario), by key: (value, comment); a comment line under one continues it."""
    doc = inspect.getdoc(importlib.import_module(module_name)) or ""
    found: dict[str, tuple[str, str]] = {}
    last, indent = None, 0
    for line in doc.splitlines():
        if not line.startswith(" "):
            last = None
            continue
        key_line, more = KEY_LINE.match(line), MORE_LINE.match(line)
        if key_line:
            spaces, key, value, comment = key_line.groups()
            old = found.get(key)
            found[key] = (old[0] if old else value, f"{old[1]}; {comment}" if old else comment)
            last, indent = key, len(spaces)
        elif more and last and len(line) - len(line.lstrip()) > indent:  # deeper: it goes on
            value, comment = found[last]
            found[last] = (value, f"{comment} {more.group(1)}")
    return found


def example_note(model: type, name: str, walk: Walk) -> str:
    """What the module docstring's example says of ``model``'s field ``name``, where ``model``
    is the one its example is about (of that module's models, the one with most of its keys)."""
    examples = docstring_examples(model.__module__)
    mine = [m for m in walk.order if m.__module__ == model.__module__]
    owner = max(mine, key=lambda m: len(examples.keys() & m.model_fields.keys()), default=None)
    if owner is not model or name not in examples:
        return ""
    value, comment = examples[name]
    return f"Example: `{name}: {value}` ({comment.strip()})" if comment.strip() else f"Example: `{name}: {value}`"


def scenario_reference() -> str:
    """One table per model of the scenario: key, type, default, what the code says, where."""
    from simulator.config.scenario import Scenario

    walk = Walk()
    walk.visit(Scenario, "")
    engine_knobs = _engine_knobs()
    out = []
    for model in walk.order:
        title = walk.title(model)
        out.append(f"### {title} {{#{walk.anchor(model)}}}\n")
        prose = docstring_prose(model) if model is not Scenario else ""
        if prose and not prose.startswith(("A scenario", "Usage docs")):
            out.append(prose + "\n")
        source = relative(inspect.getsourcefile(model) or "")
        out.append(f"`{model.__name__}` in `{source}`.\n")
        out.append("| key | type | default | the code's note | line |")
        out.append("|---|---|---|---|---|")
        prefix = walk.paths[model][0] + "." if walk.paths[model][0] else ""
        for name, field in model.model_fields.items():
            path, first, last = field_origin(model, name)
            note = comment_at(path, first, last)
            if field.description:
                note = f"{field.description} {note}".strip()
            example = example_note(model, name, walk)
            if example:
                note = f"{note}. {example}" if note else example
            if field.is_required():
                default = "required"
            elif _is_model(type(field.default)):
                default = f"[its defaults](#{walk.anchor(type(field.default))})"
            else:
                default = f"`{yaml_value(field.default)}`"
                if model is Scenario and name in engine_knobs and field.default is None:
                    default += " (the engine's default: [by engine and GPU](#engine-defaults))"
            key = f"`{prefix}{name}`"
            kind = walk.describe(field.annotation, list(field.metadata))
            where = Path(path).name if relative(path) == source else relative(path)
            out.append(f"| {key} | {cell(kind)} | {cell(default)} | {cell(rst_to_md(note))} | `{where}:{first}` |")
        out.append("")
    return "\n".join(out)


def engine_defaults() -> str:
    """What each knob a scenario leaves unset becomes, by engine and GPU (engine_defaults)."""
    from simulator.config.deployment import engine_defaults as resolve
    from simulator.config.scenario import Scenario
    from simulator.kv.gpus import get_gpu, list_gpus
    from simulator.scheduler.config import ENGINES

    knobs = _engine_knobs()
    max_model_len = 8192
    rows = ["| GPU | engine | " + " | ".join(f"`{k}`" for k in knobs) + " |",
            "|---|---|" + "---|" * len(knobs)]
    for gpu_name in list_gpus():
        gpu = get_gpu(gpu_name)
        for engine in ENGINES:
            scenario = Scenario.model_validate({"model": "llama-3.1-8b", "gpu": gpu_name, "engine": engine,
                                                "workload": {"trace": "bundled:azure-conv"}})
            resolved = resolve(scenario, gpu, max_model_len)._asdict()
            values = []
            for k in knobs:
                value = resolved[k]
                if k == "max_num_seqs" and engine == "sglang" and not value:
                    values.append("from the KV pool")
                else:
                    values.append(yaml_value(value))
            rows.append(f"| {gpu.name} | {engine} | " + " | ".join(cell(v) for v in values) + " |")
    note = (f"Resolved by `engine_defaults` in `{relative(inspect.getsourcefile(resolve) or '')}` for a "
            f"scenario that sets none of them (tensor parallel 1, max_model_len {max_model_len:,}, chunked "
            f"prefill as each engine defaults it). What it says of each engine:")
    return "\n".join(rows) + "\n\n" + note + "\n\n" + docstring_prose(resolve).split("\n", 2)[-1].strip() + "\n"


# ----------------------------------------------------------------------------- commands
def command_parser(name: str) -> argparse.ArgumentParser:
    """The parser of command ``name``: a built-in one as the CLI builds it, a backend one
    (pyproject.toml's ``kvplan.commands`` entry points) from its ``add_*_parser`` function,
    which needs argparse only (not torch)."""
    from simulator.cli import COMMANDS, build_parser

    if name in COMMANDS:
        parser = build_parser(name)
    else:
        points = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
            "entry-points"]["kvplan.commands"]
        if name not in points:
            raise KeyError(f"no command '{name}' (built-in: {', '.join(COMMANDS)}; entry points: {', '.join(points)})")
        module, _, function = points[name].partition(":")
        parser = argparse.ArgumentParser(prog="kvplan")
        getattr(importlib.import_module(module), function)(parser.add_subparsers(dest="command"))
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


def _flag_text(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    value = ""
    if action.nargs != 0:
        metavar = action.metavar or (("{" + ",".join(map(str, action.choices)) + "}") if action.choices
                                     else action.dest.upper())
        value = f" {metavar}" + (" ..." if action.nargs in ("+", "*") else "")
    return ", ".join(f"`{flag}{value}`" for flag in action.option_strings)


def _default_text(action: argparse.Action) -> str:
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        return "off"
    if action.default in (None, [], argparse.SUPPRESS) or action.required:
        return "required" if action.required else "—"
    if isinstance(action, argparse._StoreConstAction) and action.default is None:
        return "—"
    return f"`{action.default}`"


def command_reference(name: str) -> str:
    """Usage and one table per argument group of command ``name``."""
    p = command_parser(name)
    formatter = argparse.HelpFormatter(prog=p.prog, width=USAGE_WIDTH)
    formatter.add_usage(p.usage, p._actions, p._mutually_exclusive_groups)
    out = [f"```text\n{formatter.format_help().strip()}\n```\n"]
    if p.description:
        out.append(cell(p.description) + "\n")
    exclusive = {a: g for g in p._mutually_exclusive_groups for a in g._group_actions}
    for group in p._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        title = {"positional arguments": "Arguments", "options": "Options"}.get(group.title or "", group.title)
        out.append(f"**{title}**\n")
        if group.description:
            out.append(cell(group.description) + "\n")
        out.append("| argument | default | what it does |")
        out.append("|---|---|---|")
        for action in actions:
            text = (action.help or "") % {"default": action.default, "prog": p.prog}
            if isinstance(action, argparse._AppendAction):
                text += " (repeatable)"
            if action.choices and action.option_strings and not action.metavar:
                pass  # the flag shows them
            elif action.choices:
                text += " (one of: " + ", ".join(map(str, action.choices)) + ")"
            if action in exclusive:
                others = [o.option_strings[0] for o in exclusive[action]._group_actions if o is not action]
                text += " (not with " + ", ".join(f"`{o}`" for o in others) + ")"
            out.append(f"| {_flag_text(action)} | {cell(_default_text(action))} | {cell(text)} |")
        out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------------------- catalogs
def _catalog_comments(module: Any, variable: str) -> list[str]:
    """The comment lines right above each element of the tuple ``variable`` in ``module``."""
    path = inspect.getsourcefile(module)
    assert path is not None
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) else None)
        if isinstance(target, ast.Name) and target.id == variable and isinstance(node.value, ast.Tuple):
            return [comment_at(path, e.lineno, e.lineno) for e in node.value.elts]
    raise LookupError(f"{module.__name__}.{variable}: not a tuple literal")


def gpu_catalog() -> str:
    from simulator.kv import gpus

    aliases: dict[str, list[str]] = {}
    for alias, name in getattr(gpus, "_ALIASES", {}).items():
        aliases.setdefault(name, []).append(alias)
    rows = ["| GPU | also | HBM | reported | HBM bandwidth | BF16 dense | FP8 dense | INT8 dense | GPU link (per direction) | $/GPU-hour |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    specs = [gpus.get_gpu(name) for name in gpus.list_gpus()]
    for g in specs:
        tops = lambda v: f"{v / 1e12:,.0f} T" if v else "—"  # noqa: E731
        reported = f"{g.reported_bytes / 2**30:.2f} GiB" if g.reported_bytes else "—"
        rows.append(f"| {g.name} | {cell(', '.join(aliases.get(g.name, [])))} | {g.hbm_gib:g} GiB | {reported} | "
                    f"{g.hbm_bandwidth_bytes_s / 1e12:.3g} TB/s | {tops(g.dense_bf16_flops)} | "
                    f"{tops(g.dense_fp8_flops)} | {tops(g.dense_int8_ops)} | "
                    f"{g.interconnect_bandwidth_bytes_s / 1e9:g} GB/s | {g.price_usd_per_hour:g} |")
    sources = [f"* **{g.name}**: {cell(c)}" for g, c in zip(specs, _catalog_comments(gpus, "_CATALOG"))]
    return ("\n".join(rows) + f"\n\nFrom `{relative(inspect.getsourcefile(gpus) or '')}`, whose conventions are:"
            f"\n\n{docstring_prose(gpus).split(chr(10), 2)[-1].strip()}\n\nSources, as the catalog cites them:\n\n"
            + "\n".join(sources) + "\n")


def model_catalog() -> str:
    from simulator.kv.catalog import get_model, list_models
    from simulator.kv.sizing import model_kv_layout

    rows = ["| model | Hugging Face id | layers | attention | KV per token (model dtype, TP 1) | "
            "weights | context | kinds of layer |",
            "|---|---|---|---|---|---|---|---|"]
    for name in list_models():
        m = get_model(name)
        if m.is_mla:
            attention = f"MLA, latent {m.kv_latent_width}"
        else:
            attention = f"{m.num_attention_heads} q / {m.num_key_value_heads} kv heads × {m.head_dim}"
        if m.is_moe:
            attention += f"; MoE {m.num_experts_per_tok} of {m.n_routed_experts} experts"
        beta = model_kv_layout(m, "auto", 1).bytes_per_token
        weights = m.torch_dtype if m.quantization is None else f"{m.quantization.method} ({m.torch_dtype} rest)"
        kinds = ", ".join(sorted({k.replace("_attention", "") for k in m.layer_types})) or "full"
        rows.append(f"| {m.name} | {cell(m.hf_id or '—')} | {m.num_hidden_layers} | {cell(attention)} | "
                    f"{beta:,} B | {cell(weights)} | {m.max_position_embeddings:,} | {cell(kinds)} |")
    return "\n".join(rows) + "\n"


def roofline_fit() -> str:
    """The roofline's fitted defaults (simulator/latency/roofline_fit.json) and their errors."""
    import json

    from simulator.latency import constants

    path = Path(inspect.getsourcefile(constants) or "").with_name("roofline_fit.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    fit = data["fit"]
    meaning = {}
    for line in (inspect.getdoc(constants.RooflineConstants) or "").split("\n* ")[1:]:
        name, _, text = line.partition(":")
        meaning[name.strip("` ")] = " ".join(text.split())
    rows = ["| constant | fitted default | started from | what it is |", "|---|---|---|---|"]
    for name, value in data["constants"].items():
        start = fit.get("start", {}).get(name)
        shown = f"{value:.3g}" if not name.endswith("_s") else _seconds(value)
        begun = "—" if start is None else (f"{start:g}" if not name.endswith("_s") else _seconds(start))
        fixed = " (held fixed)" if name in fit.get("fixed", {}) else ""
        rows.append(f"| `{name}` | {shown}{fixed} | {begun} | {cell(rst_to_md(meaning.get(name, '')))} |")
    error = fit["error"]
    metrics = sorted(error["in_sample_mape"]["by_metric"])
    err_rows = ["| metric | in sample | leaving the row's source out | target (held out) |",
                "|---|---|---|---|"]
    for metric in metrics:
        target = error.get("targets", {}).get(metric)
        verdict = "—" if not target else (f"≤ {target['bound']:.0%}: " + ("met" if target["met"] else "not met"))
        err_rows.append(f"| {metric} | {_pct(error['in_sample_mape']['by_metric'][metric])} | "
                        f"{_pct(error['held_out_mape']['by_metric'][metric])} | {verdict} |")
    src_rows = ["| source | in sample | held out |", "|---|---|---|"]
    for source, value in error["in_sample_mape"]["by_source"].items():
        held = error["held_out_mape"]["by_source"].get(source)
        src_rows.append(f"| `{source}` | {_pct(value)} | {_pct(held)} |")
    head = (f"Fitted on `{fit['fitted_on']}` on {fit['date']}: {error['num_rows_simulated']} rows simulated, "
            f"from {len(error['in_sample_mape']['by_source'])} sources; objective: {fit['objective']}. "
            f"From `{relative(path)}`, which `kvplan validate --fit --write` writes.")
    return "\n".join([head, "", *rows, "", "Mean absolute percentage error per metric:", "", *err_rows, "",
                      "Per source (— : no row of that source could be simulated):", "", *src_rows,
                      *_architecture_sets(data)]) + "\n"


def _architecture_sets(data: dict) -> list[str]:
    """The per-architecture sets (validate --silicon --fit --write) and their errors, if any."""
    info = data["fit"].get("per_architecture")
    if not info:
        return []
    archs = info["architectures"]
    names = [n for n in data["constants"]]
    out = ["", f"Per GPU architecture, fitted on `{info['fitted_on']}` on {info['date']} "
               f"(objective: {info['objective']}; {info['adoption']}). A GPU of an adopted "
               "architecture takes its set; the others take the global one.", "",
           "| constant | " + " | ".join(archs) + " |", "|---|" + "---|" * len(archs)]
    for name in names:
        cells = []
        for arch in archs:
            value = data.get("per_architecture", {}).get(arch, {}).get(name)
            cells.append("—" if value is None else (f"{value:.3g}" if not name.endswith("_s") else _seconds(value)))
        out.append(f"| `{name}` | " + " | ".join(cells) + " |")
    out += ["", "| architecture | rows | adopted | TTFT global / fitted / held out | "
                "TPOT global / fitted / held out |", "|---|---|---|---|---|"]
    for arch, a in archs.items():
        m = a["mape"]
        out.append(f"| {arch} | {a['num_rows']} | {'yes' if a['adopted'] else 'no'} | "
                   + " / ".join(_pct(m[k]["ttft"]) for k in ("global", "fitted", "held_out")) + " | "
                   + " / ".join(_pct(m[k]["tpot"]) for k in ("global", "fitted", "held_out")) + " |")
    return out


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def _seconds(value: float) -> str:
    if value == 0:
        return "0"
    return f"{value * 1e3:.3g} ms" if value >= 1e-3 else f"{value * 1e6:.3g} µs"
