"""Files written whole or not at all: the one way peagle writes a file that another process may read, or write at
the same moment (cached heads and models, caches, checkpoints, training data): a temporary name of this process's
own beside it, then one rename."""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def temp_beside(path: str | os.PathLike) -> Path:
    """``path``'s temporary name for this process: beside it (the same file system, so the rename is atomic),
    and carrying the process id, so that two processes writing the same file each write their own."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def temps_of(path: str | os.PathLike) -> Iterator[tuple[Path, str]]:
    """The temporary files :func:`temp_beside` named for ``path``, each with the text its writer's pid stands in."""
    path = Path(path)
    for f in path.parent.glob(f"{path.name}.*.tmp"):
        yield f, f.name[len(path.name) + 1:-len(".tmp")]


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make a rename in ``folder`` durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename a finished temp file over ``dst`` so that a crash or power loss leaves the old file or the new
    one, whole: the file's data is fsynced before the rename (else the rename can reach the disk first and
    leave an empty or partial file under the final name), and the folder after it (the rename itself)."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, dst)
    fsync_folder(Path(dst).parent)


@contextlib.contextmanager
def written(path: str | os.PathLike, durable: bool = False) -> Iterator[Path]:
    """The temporary path to write file ``path`` at; when the block ends, the file takes ``path``'s place in one
    rename (its data fsynced first where ``durable``: checkpoints and training data), so that readers see the old
    file, none, or the whole new one. Where the block raises, the temporary file is deleted."""
    path = Path(path)
    tmp = temp_beside(path)
    try:
        yield tmp
        if durable:
            replace_durably(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def remembered(path: Path | None, key: str, make: Callable[[], Any], valid: Callable[[Any], bool]) -> Any:
    """``make()``'s value, kept under ``key`` in the JSON object at ``path`` (a measurement a later process
    would repeat: the kernels' tile widths, the engine's pass costs): a value found there that ``valid`` accepts
    is taken instead; a missing, torn or foreign file counts as empty. A new value is added in one rename; a
    read-only home only costs the next process the measurement again. ``path`` None: always made."""
    known: dict = {}
    if path is not None:
        with contextlib.suppress(OSError, ValueError):
            data = json.loads(Path(path).read_text())
            known = data if isinstance(data, dict) else {}
        if key in known and valid(known[key]):
            return known[key]
    value = make()
    if path is not None:
        with contextlib.suppress(OSError):
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with written(path) as tmp:
                tmp.write_text(json.dumps({**known, key: value}))
    return value
