"""The files yax reads and writes (weights, and through `yax.internal` the explorer's export and
snapshot): paths checked before anything is opened, and files written whole or not at all.

Reading: ``open_regular`` refuses what is not a regular file before opening it (a named pipe opened
for reading waits, uninterruptibly, for a writer; a device may never end), then opens it without
blocking and checks again what it opened, so a path swapped in between cannot make it wait either.

Writing: ``staged`` gives each file a new name beside it to be written under, and renames them all
to their names only when every one is whole. A full disk, a killed writer or an exception leaves
no truncated file, and the file that was there (if it is replaced) stays as it was until then: a
retry finds the path as it was before. A new file gets the mode ``open`` would give it (0666 less
the umask); a replaced one keeps its own.

Every refusal is raised as the caller's error class (a `YaxError`), with a message saying what the
path is, what was expected and what to try.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from typing import IO, Any

from .errors import YaxError

_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)


def fspath(path: Any, what: str, example: str, error: type[YaxError]) -> str:
    """``path`` (a `str`, `bytes` or `os.PathLike`) as a string, else ``error``.

    ``what`` names the function (```save_weights```); ``example`` is a call to suggest."""
    try:
        text = os.fsdecode(os.fspath(path)) if isinstance(path, (str, bytes, os.PathLike)) else None
    except TypeError:  # an os.PathLike whose __fspath__ returns neither str nor bytes
        text = None
    if text is None:
        raise error(f"{what} takes the path of a file, but got `{str(path)[:40]}` of type `{type(path).__name__}`. "
                    f"Try {example}.")
    if not text or "\0" in text:
        raise error(f"{what} takes the path of a file, but got {text[:40]!r}, which "
                    f"{'is empty' if not text else 'holds a NUL character, which no path can'}. Try {example}.")
    return text


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, for a message."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISCHR, "a device"),
                       (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _reason(e: OSError) -> str:
    return e.strerror or type(e).__name__


def _name_max(folder: str) -> int:
    try:
        return int(os.pathconf(folder or ".", "PC_NAME_MAX"))
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or the folder does not say
        return 255


def _long_name(path: str, noun: str) -> str | None:
    """The message for a file name longer than its folder takes, or None."""
    folder, name = os.path.split(path)
    size, most = len(os.fsencode(name)), _name_max(folder)
    if size <= most:
        return None
    shown = name if len(name) <= 60 else f"{name[:28]}…{name[-28:]}"
    return (f"The file name `{shown}` is {size} bytes long, but the folder `{folder or '.'}` takes names of at most "
            f"{most} bytes, so {noun} cannot be written there. Try a shorter name.")


def open_regular(path: str, noun: str, error: type[YaxError]) -> IO[bytes]:
    """``path`` opened for reading (unbuffered), if it is a regular file; else ``error`` naming
    what it is. ``noun`` says what the file should hold (``"weights"``)."""

    def refused(e: OSError) -> YaxError:
        folder = os.path.dirname(path)
        if isinstance(e, FileNotFoundError):
            where = (f" (the folder `{folder}` does not exist)" if folder and not os.path.isdir(folder) else "")
            return error(f"There is no file `{path}`{where} to read {noun} from. Try the path of a file that exists "
                         "(a relative path is taken from the working directory, "
                         f"`{os.getcwd()}`).")
        if e.errno == errno.ENAMETOOLONG:
            return error(_long_name(path, noun) or f"The path `{path[:80]}…` is too long to open. Try a shorter one.")
        return error(f"`{path}` could not be opened to read {noun}: {_reason(e)}. Try a file you may read.")

    try:
        mode = os.stat(path).st_mode  # before opening: opening a named pipe or a device may wait, or do something
    except OSError as e:
        raise refused(e) from None
    if stat.S_ISREG(mode):
        try:
            fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | _NOCTTY | getattr(os, "O_BINARY", 0))
        except OSError as e:
            raise refused(e) from None
        try:
            mode = os.fstat(fd).st_mode  # what was opened, should the path have changed since
            if stat.S_ISREG(mode):
                if _NONBLOCK:
                    os.set_blocking(fd, True)
                return os.fdopen(fd, "rb", buffering=0)
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    raise error(f"`{path}` is {_kind(mode)}, not a regular file, so {noun} cannot be read from it. Try the path of "
                "a file" + (" in it." if stat.S_ISDIR(mode) else "."))


def read_into(fh: Any, offset: int, out: Any) -> bool:
    """Fill the writable buffer ``out`` (a NumPy array of bytes) from ``fh`` (a binary file,
    from `open_regular`) at ``offset``; False when the file ends first."""
    view = memoryview(out).cast("B")
    fh.seek(offset)
    done = 0
    while done < len(view):
        n = fh.readinto(view[done:])  # a read may return less than asked (Linux: at most ~2 GiB)
        if not n:
            return False
        done += n
    return True


def check_target(path: str, noun: str, error: type[YaxError], *, replace: bool, inside: str | None = None) -> None:
    """Refuse, before anything is computed, a path that a file cannot be written to: in a folder
    that does not exist, a name too long for its folder, a folder, a named pipe or device, or (unless
    ``replace``) a file that exists. ``noun`` is what is written (``"the weights"``); ``inside`` a
    file name to suggest in the folder when ``path`` is one."""
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise error(f"The folder `{folder}` does not exist, so {noun} cannot be written to `{path}`. Create the folder "
                    "first, or try a path in a folder that exists.")
    long = _long_name(path, noun)
    if long is not None:
        raise error(long)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise error(f"`{path}` could not be looked at before writing {noun} to it: {_reason(e)}. Try another "
                    "path.") from None
    if stat.S_ISDIR(mode):
        raise error(f"`{path}` is a folder, and {noun} can be written only to a file. Try "
                    + (f"`{os.path.join(path, inside)}`." if inside else "another name."))
    if not stat.S_ISREG(mode):
        raise error(f"`{path}` is {_kind(mode)}, not a regular file, and {noun} can be written only to a file "
                    "(writing to it would wait for a reader, or send the bytes elsewhere). Try the path of a file.")
    if not replace:
        raise error(f"`{path}` exists already, and writing {noun} replaces no file unless told to. Choose another "
                    "path, or pass `overwrite=True`.")


def write_failed(path: str, noun: str, reason: str) -> str:
    """The message for a write that failed (a full disk, no permission): nothing was left behind."""
    return (f"{noun[0].upper()}{noun[1:]} could not be written to `{path}`: {reason}. Nothing was written (a file that "
            "was there is as it was). Try again once the disk has room, or try a folder you may write to.")


@contextlib.contextmanager
def staged(noun: str, error: type[YaxError], *, replace: bool) -> Iterator[Callable[[str], str]]:
    """Write files whole or not at all. Inside the block, ``stage(path)`` creates an empty file
    beside ``path`` and returns its name, to be written; when the block ends, every staged file is
    given its mode, flushed to the disk and renamed to its path. If anything fails (the block
    raises, a rename is refused), the staged files are removed, those already renamed too unless
    they replaced a file, and an `OSError` is raised as ``error`` saying nothing was written.
    Without ``replace``, a path that exists at the end is refused, not replaced. A path that is a
    symbolic link is written where the link points, as ``open`` would."""
    temps: list[tuple[str, str, str, int]] = []  # (temporary name, file, the path as given, mode)
    done: list[str] = []
    at = [""]

    def stage(path: str) -> str:
        at[0] = path
        real = os.path.realpath(path)
        folder, name = os.path.split(real)
        while True:
            temp = os.path.join(folder, f".{name[:32]}.{secrets.token_hex(4)}.tmp")
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o666)
            except FileExistsError:
                continue
            break
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)  # 0666 less the umask, as the kernel applied it
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            existing = os.stat(real).st_mode
            if stat.S_ISREG(existing):  # a replaced file keeps its mode (not set-user-ID and the like)
                mode = stat.S_IMODE(existing) & 0o777
        temps.append((temp, real, path, mode))
        return temp

    try:
        yield stage
        for temp, _, path, mode in temps:
            at[0] = path
            os.chmod(temp, mode)  # a writer may have put a file of its own there (safetensors does, as 0600)
            _sync(temp)
        for temp, real, path, _ in temps:
            at[0] = path
            if replace:
                os.replace(temp, real)
            else:
                _create(temp, real, path, noun, error)
            done.append(real)
    except BaseException as e:
        for temp, real, _, _ in temps:
            with contextlib.suppress(OSError):
                os.unlink(temp)
            if real in done and not replace:
                with contextlib.suppress(OSError):
                    os.unlink(real)
        if isinstance(e, OSError):
            raise error(write_failed(at[0], noun, _reason(e))) from e
        raise


def _create(temp: str, real: str, path: str, noun: str, error: type[YaxError]) -> None:
    """Rename ``temp`` to ``real`` unless ``real`` exists (then ``error``): as a hard link,
    which cannot replace a file, where the file system has them."""
    taken = error(f"`{path}` was created while {noun} was being made, and writing {noun} replaces no file unless "
                  "told to. Choose another path, or pass `overwrite=True`.")
    try:
        os.link(temp, real)
    except FileExistsError:
        raise taken from None
    except (OSError, NotImplementedError):  # no hard links here (FAT, some network file systems)
        if os.path.lexists(real):
            raise taken from None
        os.replace(temp, real)
        return
    os.unlink(temp)


def _sync(path: str) -> None:
    """Flush ``path`` to the disk, so that a crash after the rename leaves the whole file, not an empty one."""
    fd = os.open(path, os.O_RDONLY | _CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP, errno.EROFS):  # a file system without fsync
            raise
    finally:
        os.close(fd)
