"""Results folders that are never corrupted, mixed or lost.

Every command that writes a folder of results (``simulate``, ``capacity``, ``validate``,
``fidelity``) writes it through :func:`open_output`. Next to the folder, in its parent::

    runs/
      chat/                        the results: a reader sees the previous run's or this run's, never a mix
      .chat.lock                   one writer at a time: flock-ed by the writing process, holds its pid
      .chat.kvplan-new-1a2b3c4d/   this run's private staging folder (same filesystem: renames are atomic)
      .chat.kvplan-old-5e6f7a8b/   the previous results, for the instant between the swap's two renames

1. **Lock.** A second run into the same folder is refused at once with a one-line error that
   names the holder's pid — it neither waits nor overwrites. Refusing was chosen over
   last-writer-wins because capacity's probe cache lives in the folder during the whole run,
   and over waiting because a sweep can hold the folder for hours. The lock is ``flock(2)`` on
   the lock file: the kernel drops it when its holder dies however it dies, so a lock left by a
   killed run (its file still there, its pid dead) is simply taken over.
2. **Stage.** The run writes every result into its staging folder; an error or Ctrl-C removes
   the staging folder and leaves the previous results as they were.
3. **Swap.** Rename the previous folder aside, rename the staging folder in, move the *kept*
   entries (capacity's ``cache/``, which must survive re-runs so that an interrupted sweep
   resumes) from the old folder into the new one, remove the old folder. A re-run therefore
   replaces the folder's contents: no stale plot of an earlier run beside new tables.

A run killed between the two renames leaves the folder missing and its previous contents aside;
the next writer, holding the lock, puts them back (or moves their kept entries over) before it
starts, and removes staging folders left by dead runs.

A folder is replaced only if kvplan wrote it (it holds :data:`MARKER`, or a file the command is
known to write), or it is empty: ``--out`` pointing at a folder of other files is an error, never
a deletion.

**Whose run a folder holds.** The marker records what the run was a run *of* (a
:class:`RunSource`: the command and its input file, and a digest of the settings that shaped
it). A re-run of the same input replaces the folder; when its settings differ (the scenario file
was edited, other ``--set`` overrides) a one-line warning names both before the run starts. A run
of a *different* input (another scenario file with the same ``name:``, another command) is
refused, naming both, unless the command is given ``--replace``: one scenario's results never
disappear under another's without a word. Refusing was chosen over a warning because the warning
is read after the files are gone.

**Folders inside a folder.** A kvplan folder written *inside* another (``--out runs/chat/mine``)
is a separate output: the outer folder's re-run carries it over, as it carries the kept entries.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.errors import KvplanError, OutputError, warn_user

RUNS_DIR = Path("runs")
MARKER = ".kvplan-output"  # in every folder open_output wrote: it may be replaced by a re-run
_TOKEN_HEX = 8  # random hex digits in a staging/aside folder's name


@dataclass(frozen=True, slots=True)
class RunSource:
    """What a results folder holds a run *of* (module docstring).

    ``command`` and ``inputs`` (the resolved paths of its input files or folders; none for a
    command that reads only its own data) identify the input; ``settings`` is a digest of
    everything else that shaped the run (the resolved scenario, the flags); ``shown`` names the
    run for messages (``scenarios/chat.yaml --set block_size=32``)."""

    command: str
    inputs: tuple[str, ...]
    settings: str
    shown: str

    @classmethod
    def of(cls, command: str, inputs: Sequence[str | Path], settings: object, shown: str) -> RunSource:
        """The source of a ``command`` run on ``inputs`` with ``settings`` (anything JSON can
        write: the resolved scenario, a dict of flags)."""
        import hashlib

        text = json.dumps(settings, sort_keys=True, default=str, separators=(",", ":"))
        return cls(command, tuple(_resolved_text(Path(p)) for p in inputs),
                   hashlib.sha256(text.encode()).hexdigest()[:16], shown)

    def record(self) -> dict[str, object]:
        """The marker's fields (:func:`_write_marker`)."""
        return {"inputs": list(self.inputs), "settings": self.settings, "shown": self.shown}


def recorded_inputs(folder: str | Path) -> list[str] | None:
    """The input paths of the run a kvplan folder holds, as its marker records them (None: not
    recorded, or not a kvplan folder): ``kvplan export runs/chat`` is an export of the scenario
    file that run was a run of."""
    marker = _read_marker(Path(folder))
    inputs = marker.get("inputs") if marker else None
    if isinstance(inputs, list) and inputs and all(isinstance(p, str) for p in inputs):
        return inputs
    return None


def shown_run(path: str | Path, overrides: dict[str, object] | None = None) -> str:
    """``path`` and its dotted-key overrides as a command line would give them, for messages:
    ``scenarios/chat.yaml --set block_size=32``."""
    words = [str(path)]
    for key, value in (overrides or {}).items():
        if value is not None:
            words.append(f"--set {key}={json.dumps(value) if not isinstance(value, str) else value}")
    return " ".join(words)


def _resolved_text(path: Path) -> str:
    try:
        return str(path.expanduser().resolve())
    except (OSError, RuntimeError):
        return str(path)


def _token() -> str:
    """:data:`_TOKEN_HEX` random hex digits: what ``secrets.token_hex`` returns (os.urandom's
    bytes in hex), without importing secrets (and hmac, hashlib) into every command."""
    return os.urandom(_TOKEN_HEX // 2).hex()


@dataclass(frozen=True, slots=True)
class OutputFolder:
    """A results folder being written.

    ``path`` is where the results land, as the user named it (for messages); ``staging`` is the
    private folder to write them into now. ``keep`` entries (e.g. capacity's ``cache``) live at
    ``path / name`` during the run and survive the swap.
    """

    path: Path
    staging: Path
    keep: tuple[str, ...] = ()

    def kept(self, name: str) -> Path:
        """Where the kept entry ``name`` lives during the run and after it (``path / name``)."""
        assert name in self.keep, f"{name} is not a kept entry of {self.path}"
        return self.path / name

    def published(self, path: Path) -> Path:
        """Where a file written at ``path`` (inside ``staging``) will be once the run is swapped in."""
        try:
            return self.path / Path(path).relative_to(self.staging)
        except ValueError:
            return Path(path)


def add_replace_arg(parser: Any) -> None:
    """``--replace``, for every command that writes a results folder (module docstring)."""
    parser.add_argument("--replace", action="store_true",
                        help="write over an output folder that holds a run of another input (by "
                             "default that is refused; a re-run of the same input replaces its folder)")


def default_out_dir(name: object, *, suffix: str = "", where: str) -> Path:
    """``runs/<name><suffix>``: the default ``--out`` of a scenario named ``name``.

    A name is one plain folder name; one that is empty, ``.``/``..``, or holds a path separator
    (an absolute path, ``../x``) would write outside ``runs/`` and is a KvplanError at ``where``.
    """
    text = str(name)
    if text in ("", ".", "..") or any(ch in text for ch in ("/", "\\", "\0")):
        raise OutputError(f"{where}: name {text!r} cannot name a folder in runs/ (no '/', '\\' or "
                          "'..' allowed): give a plain name, or the output folder with --out")
    return RUNS_DIR / f"{text}{suffix}"


@contextlib.contextmanager
def open_output(path: str | Path, *, command: str, keep: Sequence[str] = (),
                recognised: Sequence[str] = (), source: RunSource | None = None,
                replace: bool = False) -> Iterator[OutputFolder]:
    """Lock ``path``, yield an :class:`OutputFolder` whose ``staging`` folder the caller fills,
    and swap it in at ``path`` when the ``with`` block ends normally (module docstring). An
    exception (a KvplanError, Ctrl-C) discards the staging folder and leaves ``path`` untouched.

    ``command`` is recorded in the marker file; ``keep`` names entries of the previous folder
    that survive the swap; ``recognised`` names files the command wrote before folders carried
    the marker (a folder holding one of them may be replaced too). ``source`` says what this is
    a run of; a folder holding a run of another source is refused unless ``replace`` (module
    docstring).

    Raises KvplanError (one line, naming ``path``) when ``path`` is a file, lies under a file,
    cannot be created or written, holds the working folder, holds files kvplan did not write or
    a run of another input, or is being written by another run; and when writing the results
    fails (a full disk): the previous results are then left as they were.
    """
    shown = str(path)
    final = check_output(path, recognised=recognised, command=command, source=source, replace=replace)
    lock = _FolderLock(final.parent / f".{final.name}.lock", shown)
    lock.acquire()
    try:
        _recover(final, tuple(keep))
        _check_replaceable(final, shown, recognised)
        _check_source(final, shown, command, source, replace, say=True)
        if keep and not final.exists():
            # kept entries are written in place during the run: the folder must exist, and say it is ours
            _mkdir(final, shown)
            _write_marker(final, command, source)
        staging = _make_sibling(final, "new", shown)
        try:
            try:
                yield OutputFolder(Path(path).expanduser(), staging, tuple(keep))
            except OSError as err:
                if not _is_write_failure(err, staging):
                    raise
                raise OutputError(_write_failure(shown, err, staging)) from None
            _write_marker(staging, command, source)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _swap(final, staging, tuple(keep), shown)
    finally:
        lock.release()


def check_output(path: str | Path, *, recognised: Sequence[str] = (), command: str | None = None,
                 source: RunSource | None = None, replace: bool = False) -> Path:
    """Check, without locking, that :func:`open_output` could write ``path`` now, and create its
    parent: a command that computes for long before it writes calls this first, so that a bad
    ``--out`` (or one holding another input's run: give ``command`` and ``source``) fails at
    once. Returns the resolved path; raises KvplanError as open_output does (its warnings are
    open_output's alone: they are said once)."""
    shown = str(path)
    final = _resolve(Path(path), shown)
    _check_target(final, shown)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputError(f"{shown}: cannot create the folder ({err.strerror})") from None
    if not os.access(final.parent, os.W_OK | os.X_OK):
        raise OutputError(f"{shown}: cannot write in {final.parent} (permission denied)")
    _check_replaceable(final, shown, recognised)
    if command is not None:
        _check_source(final, shown, command, source, replace, say=False)
    return final


def replace_file(path: Path) -> contextlib.AbstractContextManager[Path]:
    """A private temporary path next to ``path``; on a normal exit of the ``with`` block it
    replaces ``path`` atomically, on an exception it is removed. Two writers of the same file
    never share a temporary name (pid and a random token are in it)."""
    return _replacing(Path(path))


@contextlib.contextmanager
def _replacing(path: Path) -> Iterator[Path]:
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{_token()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# --- the target folder --------------------------------------------------------------------------


def _resolve(path: Path, shown: str) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError) as err:  # RuntimeError: a symlink loop (Python < 3.13)
        raise OutputError(f"{shown}: not a usable folder path ({err})") from None


def _check_target(final: Path, shown: str) -> None:
    """Refuse a folder whose replacement would take the working folder with it, and a path that
    is, or runs through, a file."""
    cwd = Path.cwd().resolve()
    if final == cwd or final in cwd.parents:
        raise OutputError(f"{shown}: is the working folder or holds it, and a run replaces its folder "
                          "as a whole: give a folder of its own")
    probe = final
    try:
        while not probe.exists() and not probe.is_symlink():
            probe = probe.parent
        if probe.is_dir():
            return
    except OSError as err:
        raise OutputError(f"{shown}: cannot look at the folder ({err.strerror or err})") from None
    if probe == final:
        raise OutputError(f"{shown}: exists and is not a folder")
    raise OutputError(f"{shown}: {probe} is a file, not a folder")


def _check_replaceable(final: Path, shown: str, recognised: Sequence[str]) -> None:
    """A folder is replaced only if kvplan wrote it, or it is empty (module docstring)."""
    try:
        names = sorted(os.listdir(final))
    except FileNotFoundError:
        return
    except OSError as err:
        raise OutputError(f"{shown}: cannot read the folder ({err.strerror})") from None
    if not names or MARKER in names or set(names) & set(recognised):
        return
    if set(names) <= set(_nested_outputs(final, ())):
        return  # only kvplan folders of their own (``--out`` inside it): carried over by the swap
    listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    raise OutputError(f"{shown}: the folder holds files kvplan did not write ({listed}), and a run "
                      "replaces its folder as a whole: give an empty or new folder")


def _read_marker(final: Path) -> dict[str, object] | None:
    """The marker of a folder kvplan wrote (None: no folder, no marker, or one unreadable)."""
    try:
        data = json.loads((final / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def _check_source(final: Path, shown: str, command: str, source: RunSource | None, replace: bool,
                  *, say: bool) -> None:
    """Refuse (or, with ``replace``, warn) when ``final`` holds a run of another input; warn when
    it holds a run of the same input with other settings (module docstring). A folder from
    before markers recorded their source says nothing of it and is replaced as before."""
    if source is None:
        return
    marker = _read_marker(final)
    if marker is None or not isinstance(marker.get("inputs"), list):
        return
    their_inputs = [str(p) for p in marker["inputs"]]
    theirs_shown = str(marker.get("shown") or " ".join(their_inputs))
    same = marker.get("command") == source.command and their_inputs == list(source.inputs)
    if theirs_shown == source.shown and their_inputs != list(source.inputs):
        theirs_shown = " ".join(their_inputs)  # the same words for another file (run from another folder)
    theirs = f"{theirs_shown} (kvplan {marker.get('command', '?')})"
    ours = f"{source.shown} (kvplan {command})"
    if not same:
        if not replace:
            raise OutputError(f"{shown}: holds a run of {theirs}, not of {ours}: give another --out, "
                              "or --replace to replace it")
        if say:
            warn_user(f"{shown}: replacing a run of {theirs} with this run of {ours} (--replace)")
    elif marker.get("settings") != source.settings and say:
        warn_user(f"{shown}: this run replaces the one of {theirs} made with other settings "
                  "(keep both with another --out)")


_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO})


def _is_write_failure(err: OSError, staging: Path) -> bool:
    """Whether ``err`` is a failure to write the results (a full disk, a quota, a read-only
    filesystem, a file inside the staging folder), not a failure to read an input."""
    if err.errno in _WRITE_ERRNOS:
        return True
    name = err.filename if isinstance(err.filename, str) else None
    return name is not None and Path(name).resolve().is_relative_to(staging.resolve())


def _write_failure(shown: str, err: OSError, staging: Path) -> str:
    what = err.strerror or str(err)
    name = err.filename if isinstance(err.filename, str) else None
    where = ""
    if name is not None:
        with contextlib.suppress(ValueError):
            where = f" (writing {Path(name).resolve().relative_to(staging.resolve())})"
    return f"{shown}: cannot write the results: {what}{where}; the previous results are as they were"


def _mkdir(path: Path, shown: str) -> None:
    try:
        path.mkdir()
    except OSError as err:
        raise OutputError(f"{shown}: cannot create the folder ({err.strerror})") from None


def _write_marker(folder: Path, command: str, source: RunSource | None = None) -> None:
    # No time or pid in it: the same scenario and seed still give byte-identical folders.
    record: dict[str, object] = {"written_by": "kvplan", "command": command}
    if source is not None:
        record.update(source.record())
    text = json.dumps(record, sort_keys=True) + "\n"
    try:
        (folder / MARKER).write_text(text, encoding="utf-8")
    except OSError as err:
        raise OutputError(f"{folder}: cannot write {MARKER} ({err.strerror})") from None


def _sibling_pattern(final: Path) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(final.name)}\.kvplan-(new|old)-[0-9a-f]{{{_TOKEN_HEX}}}")


def _make_sibling(final: Path, kind: str, shown: str) -> Path:
    """A new, empty, uniquely named folder next to ``final``, created with the usual permissions
    (``tempfile.mkdtemp`` would make it 0700, and the swap would pass that on to the results)."""
    for _ in range(100):
        path = final.with_name(f".{final.name}.kvplan-{kind}-{_token()}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as err:
            raise OutputError(f"{shown}: cannot write in {final.parent} ({err.strerror})") from None
    raise OutputError(f"{shown}: cannot find a free staging folder name in {final.parent}")


def _aside_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.kvplan-old-{_token()}")


# --- swap and recovery ----------------------------------------------------------------------------


def _swap(final: Path, staging: Path, keep: tuple[str, ...], shown: str) -> None:
    """Put ``staging`` at ``final``. Order matters for a kill at any point (see :func:`_recover`):
    the previous folder is renamed aside *before* the new one comes in, and its kept entries
    move over only once the new folder is in place."""
    aside = _aside_name(final) if final.exists() else None
    try:
        if aside is not None:
            os.rename(final, aside)
        os.rename(staging, final)
    except OSError as err:
        if aside is not None and not final.exists():
            with contextlib.suppress(OSError):
                os.rename(aside, final)  # put the previous results back (else the next run does)
        raise OutputError(f"{shown}: cannot replace the folder ({err.strerror}); this run's results "
                          f"are in {staging}") from None
    if aside is not None:
        try:
            _move_kept(aside, final, keep)
        except OSError:
            return  # the old folder stays aside, kept entries and all: the next run moves them over
        shutil.rmtree(aside, ignore_errors=True)


def _move_kept(source: Path, final: Path, keep: tuple[str, ...]) -> None:
    """Move the kept entries, and every kvplan folder written inside ``source`` (a separate
    output: module docstring), from ``source`` into ``final``."""
    for name in (*keep, *_nested_outputs(source, keep)):
        if (source / name).exists() and not (final / name).exists():
            os.rename(source / name, final / name)


def _nested_outputs(folder: Path, keep: tuple[str, ...]) -> list[str]:
    """The entries of ``folder`` that are kvplan results folders of their own (they hold the
    marker), besides the kept ones."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    return [name for name in names if name not in keep and (folder / name / MARKER).is_file()]


def _recover(final: Path, keep: tuple[str, ...]) -> None:
    """Undo what a run killed mid-swap or mid-write left next to ``final`` (the lock is held, so
    every staging or aside folder found here belongs to a dead run)."""
    pattern = _sibling_pattern(final)
    try:
        names = sorted(os.listdir(final.parent))
    except OSError:
        return
    for name in names:
        match = pattern.fullmatch(name)
        if match is None:
            continue
        path = final.parent / name
        try:
            if match.group(1) == "old":
                if not final.exists():
                    os.rename(path, final)  # killed between the swap's renames: the previous results come back
                    continue
                _move_kept(path, final, keep)
        except OSError:
            continue  # leave it for a later run rather than lose what it holds
        shutil.rmtree(path, ignore_errors=True)


# --- the lock -------------------------------------------------------------------------------------


class _FolderLock:
    """``flock(2)`` on ``path``, which holds the holder's pid (for the error message only: the
    kernel releases the lock of a dead process, so a stale file is taken over, not trusted)."""

    def __init__(self, path: Path, shown: str) -> None:
        self.path = path
        self.shown = shown
        self.fd: int | None = None

    def acquire(self) -> None:
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as err:
                raise OutputError(f"{self.shown}: cannot write in {self.path.parent} ({err.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise OutputError(self._busy_message()) from None
                raise OutputError(f"{self.shown}: cannot lock {self.path} ({err.strerror})") from None
            # A holder releasing the lock unlinks the file first: if ours was unlinked between
            # open() and flock(), a third run may already hold a new file. Lock that one instead.
            if self._still_linked(fd):
                break
            os.close(fd)
        with contextlib.suppress(OSError):  # the pid is for messages only: a full disk may refuse it
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # before unlocking: see acquire()
        os.close(self.fd)
        self.fd = None

    def _still_linked(self, fd: int) -> bool:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def _busy_message(self) -> str:
        try:
            pid = int(self.path.read_text().strip())
        except (OSError, ValueError):
            pid = None
        holder = "another kvplan run" if pid is None else f"another kvplan run (pid {pid})"
        if pid is not None and not _alive(pid):
            holder += ", or a process it started,"
        return (f"{self.shown}: {holder} is writing this folder (lock {self.path}): wait for it to "
                "finish, or write elsewhere with --out")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, as another user
    return True


__all__ = ["MARKER", "RUNS_DIR", "OutputFolder", "RunSource", "add_replace_arg", "check_output", "recorded_inputs", "default_out_dir", "open_output",
           "replace_file", "shown_run"]
