"""What the command-line front ends share about their outputs: the picture types they draw and
the checks that refuse an output before any work (exit status 2 for the commands)."""

from __future__ import annotations

import os
import pathlib
from typing import Sequence

PICTURES = (".png", ".svg", ".pdf")


class CommandError(Exception):
    """A mistake in the command line or an output that cannot be written (exit status 2)."""


def check_writable(path: str) -> None:
    """Raises CommandError naming ``path`` when a file cannot be written there."""
    target = pathlib.Path(path)
    folder = target.parent if str(target.parent) else pathlib.Path(".")
    if target.is_dir():
        raise CommandError(f"cannot write {path}: it is a directory")
    if not folder.is_dir():
        raise CommandError(f"cannot write {path}: no such directory {str(folder)!r}")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise CommandError(f"cannot write {path}: permission denied")


def picture_type(option: str, path: str, also: Sequence[str] = ()) -> str:
    """The extension of ``path`` if it names a type this command writes, else CommandError."""
    suffix = pathlib.Path(path).suffix.lower()
    allowed = (*also, *PICTURES)
    if suffix not in allowed:
        raise CommandError(f"{option} {path}: the file's type follows its extension, which must "
                           f"be one of {', '.join(allowed)}")
    return suffix
