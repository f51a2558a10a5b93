"""Reading a user's YAML file safely (a SafeLoader: nothing is eval'd), with one-line errors.

Two things plain ``yaml.safe_load`` lets through are refused here, because both silently change
what the user wrote: a key given twice in one mapping (PyYAML keeps the last value without a
word, so ``gpu: h100`` followed later by ``gpu: h200`` runs on an H200), and a file that is not
UTF-8 (a Latin-1 comment would otherwise end in a traceback).

A third is refused because it ends in a traceback: lists and mappings nested deeper than
:data:`MAX_NESTING` levels (``[[[[...]]]]``). PyYAML, Python's ``json`` and every later step that
walks the data (validation, ``repr`` in an error message, ``json.dump`` of run.json) recurse once
per level, and Python stops at about a thousand. No input kvplan reads nests more than a few
levels, so the limit is far above any real file and far below the interpreter's. YAML aliases
(``*name``) can build deep or huge data from a short file (a list of nine aliases to a list of
nine aliases...): a document that uses them is also refused when it nests past the limit through
them, refers to itself, or expands to more than :data:`MAX_EXPANDED_VALUES` values.
:func:`check_json_nesting` applies the same limit to JSON text before ``json.loads``.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from yaml.constructor import ConstructorError

from simulator.errors import KvplanError, ScenarioError

_MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base`: later keys override merged ones, by design
MAX_NESTING = 100  # levels of lists and mappings within each other that a user's file may hold
MAX_EXPANDED_VALUES = 10_000_000  # values a document with aliases may expand to


class _TooDeep(yaml.YAMLError):
    """A collection nested deeper than :data:`MAX_NESTING` (``problem_mark``: where it starts)."""

    def __init__(self, mark: yaml.Mark) -> None:
        super().__init__(f"nested deeper than {MAX_NESTING} levels")
        self.problem_mark = mark


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping holding the same key twice, and collections nested
    deeper than :data:`MAX_NESTING` (before its recursive composer reaches Python's limit)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self.used_aliases = False

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:  # type: ignore[override]
        if self.check_event(yaml.AliasEvent):  # type: ignore[no-untyped-call]
            self.used_aliases = True
        return super().compose_node(parent, index)  # type: ignore[no-untyped-call]

    def compose_sequence_node(self, anchor: str | None) -> yaml.SequenceNode:  # type: ignore[override]
        self._enter()
        try:
            return super().compose_sequence_node(anchor)  # type: ignore[no-untyped-call]
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: str | None) -> yaml.MappingNode:  # type: ignore[override]
        self._enter()
        try:
            return super().compose_mapping_node(anchor)  # type: ignore[no-untyped-call]
        finally:
            self._depth -= 1

    def _enter(self) -> None:
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise _TooDeep(self.peek_event().start_mark)  # type: ignore[no-untyped-call]

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
        first_line: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                seen = first_line.get(key)
            except TypeError:  # an unhashable key: the base class reports it
                break
            if seen is not None:
                raise ConstructorError(
                    None, None, f"key '{key}' is given twice, first on line {seen}",
                    key_node.start_mark)
            first_line[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _check_expansion(data: object, where: str) -> None:
    """``data`` (a document that used aliases) nests at most :data:`MAX_NESTING` levels, refers
    to no collection inside itself and expands to at most :data:`MAX_EXPANDED_VALUES` values;
    else a KvplanError. Iterative, and each collection is visited once, however many aliases
    share it."""
    depth: dict[int, int] = {}  # id -> levels of lists and mappings at and below it
    size: dict[int, int] = {}  # id -> values it expands to, itself included
    open_ids: set[int] = set()
    stack: list[tuple[object, bool]] = [(data, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (list, dict)):
            continue
        key = id(node)
        children = [c for c in (node.values() if isinstance(node, dict) else node)
                    if isinstance(c, (list, dict))]
        leaves = len(node) - len(children)
        if done:
            open_ids.discard(key)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            size[key] = 1 + leaves + sum(size[id(c)] for c in children)
            if depth[key] > MAX_NESTING:
                raise ScenarioError(f"{where}: nested deeper than {MAX_NESTING} levels (through"
                                  " YAML aliases)")
            if size[key] > MAX_EXPANDED_VALUES:
                raise ScenarioError(f"{where}: its YAML aliases expand it to more than"
                                  f" {MAX_EXPANDED_VALUES:,} values")
            continue
        if key in depth:
            continue
        if key in open_ids:
            raise ScenarioError(f"{where}: a YAML alias refers to a list or mapping that holds it")
        open_ids.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children)


def parse_yaml(text: str, where: str, *, lines: bool = True) -> object:
    """The document in ``text`` (read from ``where``); bad YAML, a duplicate key or nesting
    deeper than :data:`MAX_NESTING` levels is a KvplanError naming ``where`` and the line
    (``lines`` False: not the line, for a value given on the command line)."""
    loader = _UniqueKeyLoader(text)
    try:
        data = loader.get_single_data()
    except _TooDeep as err:
        raise ScenarioError(f"{where}{f':{err.problem_mark.line + 1}' if lines else ''}: {err}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None and lines else ""
        raise ScenarioError(f"{where}{line}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
    finally:
        loader.dispose()
    if loader.used_aliases:
        _check_expansion(data, where)
    return data


# A JSON string (skipped: brackets inside it are text) or a bracket.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def check_json_nesting(text: str, where: str, first_line: int = 1) -> None:
    """Refuse JSON ``text`` (read from file ``where``, starting on line ``first_line``) that
    nests lists and objects deeper than :data:`MAX_NESTING` levels, before ``json.loads``
    (which would end in a RecursionError): a KvplanError naming ``where`` and the line. Text
    with no more brackets than the limit is passed at the cost of counting them."""
    if text.count("[") + text.count("{") <= MAX_NESTING:
        return
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        bracket = token.group()
        if bracket in "[{":
            depth += 1
            if depth > MAX_NESTING:
                line = first_line + text.count("\n", 0, token.start())
                raise ScenarioError(f"{where}:{line}: nested deeper than {MAX_NESTING} levels")
        elif bracket in "]}":
            depth -= 1


def read_yaml(path: str | Path, what: str) -> object:
    """The parsed document of ``path``; a missing file, a folder, a file that is not UTF-8,
    bad YAML, a key given twice or nesting deeper than :data:`MAX_NESTING` levels is a
    KvplanError that names the file (and the line, for YAML errors). ``what`` names the file's
    role ("scenario")."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScenarioError(f"{where}: no such {what} file") from None
    except IsADirectoryError:
        raise ScenarioError(f"{where}: is a directory, not a {what} file") from None
    except UnicodeDecodeError as err:
        line = err.object[:err.start].count(b"\n") + 1
        raise ScenarioError(f"{where}:{line}: not UTF-8 text (byte 0x{err.object[err.start]:02x});"
                          f" save the {what} file as UTF-8") from None
    except OSError as err:
        raise ScenarioError(f"{where}: cannot read the {what} file ({err.strerror or err})") from None
    return parse_yaml(text, where)
