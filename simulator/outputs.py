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

from simulator.errors import KvplanError

RUNS_DIR = Path("runs")
MARKER = ".kvplan-output"  # in every folder open_output wrote: it may be replaced by a re-run
_TOKEN_HEX = 8  # random hex digits in a staging/aside folder's name


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


def default_out_dir(name: object, *, suffix: str = "", where: str) -> Path:
    """``runs/<name><suffix>``: the default ``--out`` of a scenario named ``name``.

    A name is one plain folder name; one that is empty, ``.``/``..``, or holds a path separator
    (an absolute path, ``../x``) would write outside ``runs/`` and is a KvplanError at ``where``.
    """
    text = str(name)
    if text in ("", ".", "..") or any(ch in text for ch in ("/", "\\", "\0")):
        raise KvplanError(f"{where}: name {text!r} cannot name a folder in runs/ (no '/', '\\' or "
                          "'..' allowed): give a plain name, or the output folder with --out")
    return RUNS_DIR / f"{text}{suffix}"


@contextlib.contextmanager
def open_output(path: str | Path, *, command: str, keep: Sequence[str] = (),
                recognised: Sequence[str] = ()) -> Iterator[OutputFolder]:
    """Lock ``path``, yield an :class:`OutputFolder` whose ``staging`` folder the caller fills,
    and swap it in at ``path`` when the ``with`` block ends normally (module docstring). An
    exception (a KvplanError, Ctrl-C) discards the staging folder and leaves ``path`` untouched.

    ``command`` is recorded in the marker file; ``keep`` names entries of the previous folder
    that survive the swap; ``recognised`` names files the command wrote before folders carried
    the marker (a folder holding one of them may be replaced too).

    Raises KvplanError (one line, naming ``path``) when ``path`` is a file, lies under a file,
    cannot be created or written, holds the working folder, holds files kvplan did not write, or
    is being written by another run.
    """
    shown = str(path)
    final = check_output(path, recognised=recognised)
    lock = _FolderLock(final.parent / f".{final.name}.lock", shown)
    lock.acquire()
    try:
        _recover(final, tuple(keep))
        _check_replaceable(final, shown, recognised)
        if keep and not final.exists():
            # kept entries are written in place during the run: the folder must exist, and say it is ours
            _mkdir(final, shown)
            _write_marker(final, command)
        staging = _make_sibling(final, "new", shown)
        try:
            yield OutputFolder(Path(path).expanduser(), staging, tuple(keep))
            _write_marker(staging, command)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _swap(final, staging, tuple(keep), shown)
    finally:
        lock.release()


def check_output(path: str | Path, *, recognised: Sequence[str] = ()) -> Path:
    """Check, without locking, that :func:`open_output` could write ``path`` now, and create its
    parent: a command that computes for long before it writes calls this first, so that a bad
    ``--out`` fails at once. Returns the resolved path; raises KvplanError as open_output does."""
    shown = str(path)
    final = _resolve(Path(path), shown)
    _check_target(final, shown)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KvplanError(f"{shown}: cannot create the folder ({err.strerror})") from None
    if not os.access(final.parent, os.W_OK | os.X_OK):
        raise KvplanError(f"{shown}: cannot write in {final.parent} (permission denied)")
    _check_replaceable(final, shown, recognised)
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
        raise KvplanError(f"{shown}: not a usable folder path ({err})") from None


def _check_target(final: Path, shown: str) -> None:
    """Refuse a folder whose replacement would take the working folder with it, and a path that
    is, or runs through, a file."""
    cwd = Path.cwd().resolve()
    if final == cwd or final in cwd.parents:
        raise KvplanError(f"{shown}: is the working folder or holds it, and a run replaces its folder "
                          "as a whole: give a folder of its own")
    probe = final
    try:
        while not probe.exists() and not probe.is_symlink():
            probe = probe.parent
        if probe.is_dir():
            return
    except OSError as err:
        raise KvplanError(f"{shown}: cannot look at the folder ({err.strerror or err})") from None
    if probe == final:
        raise KvplanError(f"{shown}: exists and is not a folder")
    raise KvplanError(f"{shown}: {probe} is a file, not a folder")


def _check_replaceable(final: Path, shown: str, recognised: Sequence[str]) -> None:
    """A folder is replaced only if kvplan wrote it, or it is empty (module docstring)."""
    try:
        names = sorted(os.listdir(final))
    except FileNotFoundError:
        return
    except OSError as err:
        raise KvplanError(f"{shown}: cannot read the folder ({err.strerror})") from None
    if not names or MARKER in names or set(names) & set(recognised):
        return
    listed = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    raise KvplanError(f"{shown}: the folder holds files kvplan did not write ({listed}), and a run "
                      "replaces its folder as a whole: give an empty or new folder")


def _mkdir(path: Path, shown: str) -> None:
    try:
        path.mkdir()
    except OSError as err:
        raise KvplanError(f"{shown}: cannot create the folder ({err.strerror})") from None


def _write_marker(folder: Path, command: str) -> None:
    # No time or pid in it: the same scenario and seed still give byte-identical folders.
    text = json.dumps({"written_by": "kvplan", "command": command}, sort_keys=True) + "\n"
    try:
        (folder / MARKER).write_text(text, encoding="utf-8")
    except OSError as err:
        raise KvplanError(f"{folder}: cannot write {MARKER} ({err.strerror})") from None


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
            raise KvplanError(f"{shown}: cannot write in {final.parent} ({err.strerror})") from None
    raise KvplanError(f"{shown}: cannot find a free staging folder name in {final.parent}")


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
        raise KvplanError(f"{shown}: cannot replace the folder ({err.strerror}); this run's results "
                          f"are in {staging}") from None
    if aside is not None:
        try:
            _move_kept(aside, final, keep)
        except OSError:
            return  # the old folder stays aside, kept entries and all: the next run moves them over
        shutil.rmtree(aside, ignore_errors=True)


def _move_kept(source: Path, final: Path, keep: tuple[str, ...]) -> None:
    for name in keep:
        if (source / name).exists() and not (final / name).exists():
            os.rename(source / name, final / name)


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
                raise KvplanError(f"{self.shown}: cannot write in {self.path.parent} ({err.strerror})") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise KvplanError(self._busy_message()) from None
                raise KvplanError(f"{self.shown}: cannot lock {self.path} ({err.strerror})") from None
            # A holder releasing the lock unlinks the file first: if ours was unlinked between
            # open() and flock(), a third run may already hold a new file. Lock that one instead.
            if self._still_linked(fd):
                break
            os.close(fd)
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


__all__ = ["MARKER", "RUNS_DIR", "OutputFolder", "check_output", "default_out_dir", "open_output", "replace_file"]
