"""Reading a user's YAML file safely (``yaml.safe_load``: nothing is eval'd), with one-line errors."""

from __future__ import annotations

from pathlib import Path

import yaml

from simulator.errors import KvplanError


def read_yaml(path: str | Path, what: str) -> object:
    """The parsed document of ``path``; a missing file, a folder or bad YAML is a KvplanError that
    names the file (and the line, for YAML errors). ``what`` names the file's role ("scenario")."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise KvplanError(f"{where}: no such {what} file") from None
    except IsADirectoryError:
        raise KvplanError(f"{where}: is a directory, not a {what} file") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        raise KvplanError(f"{where}{line}: not valid YAML ({getattr(err, 'problem', None) or err})") from None
