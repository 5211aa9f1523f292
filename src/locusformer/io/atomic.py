"""Write outputs under a temporary name and rename them into place.

A rule that fails half-way must never leave a file that a later rule (or a rerun of
Snakemake) would take for a finished output, nor its temporary files: they are removed on
any exception, on SIGTERM (what SLURM sends at a time-out, once
:func:`temporaries_removed_on_sigterm` is entered, as the CLI does), and, after a SIGKILL
that no process can catch, by the next write of the same output
(:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

#: The temporary files being written now, by every thread of this process.
_LIVE: set[Path] = set()
_LIVE_LOCK = threading.Lock()
#: mkstemp's random part: 8 characters of this alphabet.
_RANDOM = "[a-z0-9_]{8}"


class WriteError(OSError):
    """An output could not be written (disk full, no permission, ...).

    ``filename`` is the output's path and ``strerror`` the reason, whatever file the
    failing call was working on (often the temporary one), so the message names the path
    the user knows.
    """


def _write_error(target: Path, exc: OSError) -> WriteError:
    if isinstance(exc, WriteError):
        return exc
    reason = exc.strerror or str(exc) or type(exc).__name__
    return WriteError(exc.errno, f"cannot write: {' '.join(reason.split())}", str(target))


def temporary_pattern(target: Path) -> re.Pattern[str]:
    """The names :func:`atomic_path` gives the temporary files of ``target``, and no other."""
    return re.compile(rf"\.{re.escape(target.name)}\.{_RANDOM}\.tmp")


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Remove the temporary files an earlier, killed write of ``target`` left beside it.

    Only names of the form :func:`atomic_path` makes for this very output are touched, and
    none that this process is writing now.
    """
    pattern = temporary_pattern(target)
    removed = []
    with contextlib.suppress(OSError), os.scandir(target.parent) as entries:
        for entry in entries:
            stale = Path(entry.path)
            if pattern.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                with _LIVE_LOCK:
                    if stale in _LIVE:
                        continue
                with contextlib.suppress(FileNotFoundError):
                    stale.unlink()
                    removed.append(stale)
    return removed


@contextlib.contextmanager
def temporaries_removed_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM removes every temporary file being written and exits with
    status 143.

    Python's default ends the process at once, leaving them; a scheduler sends SIGTERM at
    a time-out. Only the main thread can take signals: elsewhere the block changes nothing.
    The previous handler is back after the block.
    """

    def handler(signum: int, frame: FrameType | None) -> None:
        with _LIVE_LOCK:
            live = list(_LIVE)
        for tmp in live:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise SystemExit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success.

    An :class:`OSError` while creating, writing or renaming becomes a :class:`WriteError`
    that names ``path``; the temporary file is removed whatever goes wrong. Temporary
    files of ``path`` that a killed earlier write left are removed first.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _write_error(target, exc) from exc
    os.close(fd)
    tmp = Path(tmp_name)
    with _LIVE_LOCK:
        _LIVE.add(tmp)
    try:
        # mkstemp creates the file readable by its owner only; outputs get the usual mode.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)
        yield tmp
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(target, exc) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(tmp)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
