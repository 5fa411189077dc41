"""Saving matplotlib figures: the file's type follows its extension (.png, .svg, .pdf), or is
refused; text in SVG stays text (escaped by matplotlib), so pictures can be searched."""

from __future__ import annotations

import io
import os
import pathlib
from typing import IO, Any, Union

FORMATS = ("png", "svg", "pdf")

#: Pixels per inch of every saved picture (a PNG's pixels; what an SVG's embedded images are
#: drawn for).
DPI = 110

Target = Union[str, "os.PathLike[str]", IO[bytes]]


def format_of(target: Target, format: Union[str, None] = None) -> str:
    """The picture format for ``target``: ``format`` if given, else the path's extension."""
    if format is None:
        if not isinstance(target, (str, os.PathLike)):
            raise ValueError("gpupool: give format='png', 'svg' or 'pdf' when writing to a file "
                             "object")
        format = pathlib.Path(target).suffix.lower().lstrip(".")
    if format not in FORMATS:
        raise ValueError(f"gpupool: cannot draw a picture as {format!r} ({str(target)!r}): "
                         f"use .png, .svg or .pdf")
    return format


def new_figure(width: float, height: float) -> Any:
    """A figure not registered with pyplot: nothing global, safe from any thread."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:  # a dependency of the package; only a broken install lacks it
        raise ImportError("gpupool: drawing pictures needs matplotlib "
                          "(pip install matplotlib)") from exc
    return Figure(figsize=(width, height))


def save(fig: Any, target: Target, format: Union[str, None] = None) -> None:
    import matplotlib

    kind = format_of(target, format)
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(target, format=kind, dpi=DPI)


def to_bytes(fig: Any, format: str) -> bytes:
    buffer = io.BytesIO()
    save(fig, buffer, format)
    return buffer.getvalue()
