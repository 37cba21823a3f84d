"""Bounded reads of the files wf_magic is pointed at: regular files only, at most bound + 1 bytes.

Every file a user can name (a workflow file, a library index or a workflow it lists, a replay
cassette) and every small file of the state dir (the secret key, run lock holders, process
sidecars) is read through :func:`read_bounded`. It looks at the file before opening it, so a
FIFO (whose ``open`` would block until a writer comes), a device such as ``/dev/zero`` (which
never ends), a directory or a socket is refused at once, naming the path; a regular file larger
than the bound (a 3 GB sparse file) is refused from its size alone; and whatever the size
claimed, no more than ``limit + 1`` bytes are ever read.
"""

from __future__ import annotations

import os
import stat

from .errors import FileRefused

CHUNK_BYTES = 1 << 20
"""One ``os.read`` asks for at most this much."""

_SPECIAL_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)  # never wait for a FIFO's writer if one is swapped in
    | getattr(os, "O_NOCTTY", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def file_kind(mode: int) -> str | None:
    """What a non-regular file is (``"a FIFO (named pipe)"``, ...); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _SPECIAL_KINDS if test(mode)), "not a regular file")


def read_bounded(path: str | os.PathLike[str], *, limit: int) -> bytes:
    """The bytes of the regular file ``path``, if it holds at most ``limit`` of them.

    Symlinks are followed (a link to ``/dev/zero`` is a character device).

    Raises:
        FileRefused: the file is missing or unreadable (``reason="os"``, with its ``errno``),
            is not a regular file (``reason="special"``), or is larger than ``limit`` bytes
            (``reason="too_large"``). Its message is one line naming the path.
    """
    name = os.fspath(path)
    try:
        info = os.stat(name)
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL byte
        raise _os_refusal(name, exc) from None
    _refuse_unless_small_regular(name, info, limit)
    try:
        fd = os.open(name, _OPEN_FLAGS)
    except OSError as exc:
        raise _os_refusal(name, exc) from None
    try:
        # Checked again on what was opened: the path may have been swapped since the stat.
        _refuse_unless_small_regular(name, os.fstat(fd), limit)
        data = read_at_most(fd, limit + 1)
    except OSError as exc:
        raise _os_refusal(name, exc) from None
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew, or its size was not what stat said
        raise FileRefused(name, f"larger than {limit} bytes", reason="too_large")
    return data


def read_at_most(fd: int, count: int) -> bytes:
    """Up to ``count`` bytes from ``fd``: fewer only at end of file."""
    chunks: list[bytes] = []
    got = 0
    while got < count:
        chunk = os.read(fd, min(count - got, CHUNK_BYTES))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_bounded_text(path: str | os.PathLike[str], *, limit: int) -> str:
    """:func:`read_bounded`, decoded as UTF-8 (for the state dir's own small files).

    Raises:
        FileRefused: as :func:`read_bounded`.
        UnicodeDecodeError: the file is not UTF-8.
    """
    return read_bounded(path, limit=limit).decode("utf-8")


def _refuse_unless_small_regular(name: str, info: os.stat_result, limit: int) -> None:
    kind = file_kind(info.st_mode)
    if kind is not None:
        target = os.path.realpath(name)
        link = f" (a link to {target})" if target != os.path.abspath(name) else ""
        raise FileRefused(name, f"{kind}{link}, not a regular file", reason="special")
    if info.st_size > limit:
        raise FileRefused(
            name, f"larger than {limit} bytes ({info.st_size} bytes)", reason="too_large"
        )


def _os_refusal(name: str, exc: OSError | ValueError) -> FileRefused:
    if isinstance(exc, ValueError):
        return FileRefused(name, "not a valid path (it holds a NUL byte)", reason="os")
    return FileRefused(
        name,
        str(exc.strerror or exc),
        reason="missing" if isinstance(exc, FileNotFoundError) else "os",
        errno=exc.errno,
    )
