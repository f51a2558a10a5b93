"""Reading a user's YAML file safely (a SafeLoader: nothing is eval'd), with one-line errors.

Two things plain ``yaml.safe_load`` lets through are refused here, because both silently change
what the user wrote: a key given twice in one mapping (PyYAML keeps the last value without a
word, so ``gpu: h100`` followed later by ``gpu: h200`` runs on an H200), and a file that is not
UTF-8 (a Latin-1 comment would otherwise end in a traceback).
"""

from __future__ import annotations

from pathlib import Path

import yaml
from yaml.constructor import ConstructorError

from simulator.errors import KvplanError

_MERGE_TAG = "tag:yaml.org,2002:merge"  # `<<: *base`: later keys override merged ones, by design


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a mapping holding the same key twice."""

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


def parse_yaml(text: str, where: str) -> object:
    """The document in ``text`` (read from ``where``); bad YAML or a duplicate key is a
    KvplanError naming ``where`` and the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise KvplanError(f"{where}{line}: not valid YAML ({getattr(err, 'problem', None) or err})") from None


def read_yaml(path: str | Path, what: str) -> object:
    """The parsed document of ``path``; a missing file, a folder, a file that is not UTF-8,
    bad YAML or a key given twice is a KvplanError that names the file (and the line, for YAML
    errors). ``what`` names the file's role ("scenario")."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise KvplanError(f"{where}: no such {what} file") from None
    except IsADirectoryError:
        raise KvplanError(f"{where}: is a directory, not a {what} file") from None
    except UnicodeDecodeError as err:
        line = err.object[:err.start].count(b"\n") + 1
        raise KvplanError(f"{where}:{line}: not UTF-8 text (byte 0x{err.object[err.start]:02x});"
                          f" save the {what} file as UTF-8") from None
    except OSError as err:
        raise KvplanError(f"{where}: cannot read the {what} file ({err.strerror or err})") from None
    return parse_yaml(text, where)
