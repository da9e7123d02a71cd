"""Where a verb writes a file or folder the user names: what it refuses, and how it writes.

Every verb that writes what `--out` names (`ledger export`, `gate`) goes through here, so one
policy answers for all of them, and no command destroys data by a slip of the path:

- the ledger the verb reads, or its `-wal`/`-shm`/`-journal` files, under any spelling (`./x.db`,
  a symlink, a hard link: `transfer.is_ledger_file`), is refused, with `--force` too: nothing a
  verb exports is worth the ledger it came from;
- a folder where a file is expected, or a file where a folder is, is refused (nothing to force);
- a symlink, a device, a FIFO or a socket, an existing receipt, and another SQLite database (a
  ledger, most likely) are refused unless `--force`; with it, a link is followed (the file it
  names is replaced and the link kept) and a device or FIFO is written to in place, never
  replaced by a plain file;
- a file is written atomically (`written`): beside its target, fsynced, then moved over it with
  `os.replace`, so a failure, a full disk among them, leaves what was there as it was;
- folders missing on the way to a file or receipt folder are made, as `mkdir -p` does
  (`common.writable_folder` refuses a file standing where one of them must be); a failed write
  removes those it made.

A refusal is a `ConfigError` (exit 64) naming the path and why; a write that fails is an
`OSError` (exit 74, `common.EXIT_IO`). A closed stdout stays `CLIGroup`'s (exit 141), and a full
one is an `OSError` when it is flushed (exit 74).
"""

import contextlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, TextIO

from pipecat_rl.errors import ConfigError
from pipecat_rl.gate.receipt import RECEIPT_FILES
from pipecat_rl.ledger.transfer import is_ledger_file

Kind = Literal["file", "folder", "special"]
"""What a path is once links are followed: `special` is a device, a FIFO or a socket."""

_SQLITE_MAGIC = b"SQLite format 3\x00"

FORCE_HELP = (
    "Write even where --out names a symlink (the file it names is replaced), a device or FIFO "
    "(written to), a receipt or another SQLite file; never over the ledger read, or a folder."
)
"""The `--force` help of a verb writing the file `--out` names."""


def kind_of(path: Path) -> Kind | None:
    """What `path` is, links followed; None when nothing is there (or a link leads nowhere)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return "folder"
    return "file" if stat.S_ISREG(mode) else "special"


def output_file(
    path: Path, flag: str, *, force: bool = False, ledger: Path | str | None = None
) -> Path:
    """Check `path`, given to `flag`, as a file to write; returns where to write it.

    With `force` a symlink is followed: the path returned is the file it names. `ledger` is the
    ledger the verb reads, refused under any spelling.

    Raises:
        ConfigError: the policy of this module refuses `path` (the message says why and what to
            pass instead).
    """
    if ledger is not None and is_ledger_file(path, ledger):
        raise ConfigError(
            f"{flag} {path} is the ledger this reads ({ledger}), or one of its files; writing "
            "there would destroy it, so it is refused even with --force: name another file"
        )
    if path.is_symlink():
        if not force:
            raise ConfigError(
                f"{flag} {path} is a symbolic link (to {os.readlink(path)}); name the file "
                "itself, or pass --force to replace the file it links to"
            )
        path = Path(os.path.realpath(path))
    kind = kind_of(path)
    if kind == "folder":
        raise ConfigError(f"{flag} {path} is a folder; name a file in it (e.g. {path / 'out'})")
    if not force:
        why = _precious(path, kind)
        if why:
            raise ConfigError(f"{flag} {path} {why}; name another file, or pass --force")
    return path


def output_folder(
    path: Path, flag: str, *, force: bool = False, ledger: Path | str | None = None
) -> Path:
    """Check `path`, given to `flag`, as a folder to write a receipt into (made if missing).

    A folder that already holds a receipt is refused unless `force`, as a symlink is; the
    ledger the verb writes (`ledger`), even one not made yet, is refused always.

    Raises:
        ConfigError: `path` is not a folder, or is one `force` is needed for.
    """
    if ledger is not None and is_ledger_file(path, ledger):
        raise ConfigError(
            f"{flag} {path} is the ledger this writes ({ledger}), or one of its files; name a "
            "new folder for the receipt"
        )
    if path.is_symlink() and not force:
        raise ConfigError(
            f"{flag} {path} is a symbolic link (to {os.readlink(path)}); name the folder "
            "itself, or pass --force to write into the folder it links to"
        )
    kind = kind_of(path)
    if kind not in (None, "folder"):
        raise ConfigError(f"{flag} {path} is not a folder; name a new folder for the receipt")
    held = [name for name in RECEIPT_FILES if (path / name).exists()] if kind else []
    if held and not force:
        raise ConfigError(
            f"{flag} {path} already holds a receipt ({', '.join(held)}); name a new folder, or "
            "pass --force to replace it"
        )
    return path


def _precious(path: Path, kind: Kind | None) -> str | None:
    """Why writing over `path` needs --force, or None."""
    if kind == "special":
        return "is a device, FIFO or socket, not a file"
    if kind != "file":
        return None
    if path.name in RECEIPT_FILES and (path.parent / RECEIPT_FILES[0]).exists():
        return "is a gate receipt"
    try:
        with path.open("rb") as f:
            if f.read(len(_SQLITE_MAGIC)) == _SQLITE_MAGIC:
                return "is a SQLite database (another ledger?)"
    except OSError:  # unreadable: the write says what is wrong
        pass
    return None


@contextmanager
def written(path: Path) -> Iterator[TextIO]:
    """A text stream whose content becomes the file `path` only if the block ends without error.

    It is written beside `path`, fsynced and moved over it (`os.replace`), so a reader never sees
    half a file and a failure leaves `path` as it was; a file replaced keeps its permissions. A
    device or FIFO (`output_file` with --force) is written in place instead.

    Raises:
        OSError: the write failed (a full disk, permissions); the message says what was left.
    """
    kind = kind_of(path)
    try:
        if kind == "special":
            with path.open("w", encoding="utf-8") as f:
                yield f
        else:
            yield from _replaced(path, kind)
    except OSError as e:  # named: a write error of its own says neither the file nor the fallout
        left = {"file": "; it is as it was", None: "; no file was made"}.get(kind, "")
        raise OSError(e.errno, f"{e.strerror or e}{left}", str(path)) from e


def _replaced(path: Path, kind: Kind | None) -> Iterator[TextIO]:
    partial = path.with_name(f".{path.name}.{secrets.token_hex(4)}.partial")
    made = [folder for folder in (path.parent, *path.parent.parents) if not folder.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)  # as `mkdir -p`
    done = False
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # less the umask
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            if kind == "file":
                os.fchmod(f.fileno(), stat.S_IMODE(path.stat().st_mode))
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
        done = True
    finally:
        partial.unlink(missing_ok=True)
        for folder in made if not done else ():  # deepest first: a failure leaves none it made
            with contextlib.suppress(OSError):
                folder.rmdir()
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable; best effort, as some filesystems refuse it."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
