"""The ``gpupool`` command (also ``python -m gpupool``): ``info``, ``demo``, ``bench``,
``--version``, with the options of the C++ tool, which does the work. This front end adds
pictures: ``demo --timeline t.png`` and ``bench --plot b.png`` (.png, .svg or .pdf, drawn with
matplotlib from the JSON the tool writes), and ``demo`` runs the motivating program (CuPy in a
ThreadPoolExecutor) beside gpupool where CuPy can, and prints the ratio (``--no-compare``: not).
Every other argument goes to the tool unchanged."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence

from ._outputs import CommandError, check_writable, picture_type

# The option of each command that names a picture, and what else that option accepts.
_PICTURE_OPTIONS = {"demo": ("--timeline", (".json",)), "bench": ("--plot", ())}


def tool_path() -> pathlib.Path:
    """The C++ tool installed inside the package (``pip install .`` builds it)."""
    return pathlib.Path(__file__).resolve().parent / "bin" / "gpupool"


def _take_option(args: List[str], name: str) -> Optional[str]:
    """Removes ``name VALUE`` or ``name=VALUE`` from ``args``; returns VALUE (None if absent).
    When given more than once, the last one counts, as in the tool."""
    value = None
    i = 0
    while i < len(args):
        if args[i] == name and i + 1 < len(args):
            value = args[i + 1]
            del args[i:i + 2]
        elif args[i].startswith(name + "="):
            value = args[i][len(name) + 1:]
            del args[i]
        else:
            i += 1
    return value


def _take_flag(args: List[str], name: str) -> bool:
    """Removes every ``name`` from ``args``; returns whether there was one."""
    found = name in args
    args[:] = [a for a in args if a != name]
    return found


def _option_value(args: Sequence[str], name: str) -> Optional[str]:
    found = None
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(name + "="):
            found = arg[len(name) + 1:]
    return found


def _draw(command: str, source: pathlib.Path, picture: str) -> None:
    import json

    from . import plot

    with open(source, encoding="utf-8") as f:
        data = json.load(f)
    if command == "demo":
        plot.draw_timeline(plot.records_from_json(data), picture, backend=data["backend"],
                           stages=data.get("stages"))
    else:
        plot.draw_bench(data, picture)


def run(argv: Sequence[str]) -> int:
    """Runs the command line ``argv`` (without the program name); returns the exit status."""
    args = list(argv)
    command = next((a for a in args if not a.startswith("-")), None)
    if args and args[0] == "compare":
        # The comparison harness is Python (it drives CuPy, PyTorch and the C++ programs).
        from .compare import main as compare_main

        return compare_main(args[1:])
    picture = None
    option = None
    if command in _PICTURE_OPTIONS:
        option, also = _PICTURE_OPTIONS[command]
        picture = _take_option(args, option)
        if picture is not None:
            if picture_type(option, picture, also) in also:
                args += [option, picture]  # the tool writes it itself
                picture = None
            else:
                check_writable(picture)
    tool = tool_path()
    if not tool.is_file():
        raise CommandError(f"the command-line tool is missing from this installation ({tool}); "
                           "install the package with `pip install .` from a gpupool checkout")
    beside = False
    if command == "demo":
        beside = not _take_flag(args, "--no-compare")
        if "-h" in args or "--help" in args:
            beside = False
    with tempfile.TemporaryDirectory(prefix="gpupool-") as scratch:
        source = None
        if picture is not None:
            if command == "demo":
                source = pathlib.Path(scratch) / "records.json"
                args += ["--timeline", str(source)]
            else:
                given = _option_value(args, "--json")
                source = pathlib.Path(given) if given else pathlib.Path(scratch) / "bench.json"
                if not given:
                    args += ["--json", str(source)]
        summary = None
        if beside:
            given = _option_value(args, "--summary")
            summary = pathlib.Path(given) if given else pathlib.Path(scratch) / "summary.json"
            if not given:
                args += ["--summary", str(summary)]
        # With --json and the comparison, the tool's object is printed with the comparison's
        # figures added, so that the output stays one JSON object.
        merge_json = beside and "--json" in args
        sys.stdout.flush()
        if merge_json:
            done = subprocess.run([str(tool), *args], stdout=subprocess.PIPE, text=True)
            status = done.returncode
            if status != 0:  # its object, saying what went wrong, as it printed it
                print(done.stdout, end="")
        else:
            status = subprocess.call([str(tool), *args])
        if command == "demo" and ("-h" in args or "--help" in args) and status == 0:
            print("  --no-compare                (the Python package's command) do not run the "
                  "motivating program\n                              (CuPy in a "
                  "ThreadPoolExecutor) beside gpupool")
        if status != 0:
            return status
        if picture is not None and source is not None:
            try:
                _draw(command or "", source, picture)
            except OSError as exc:
                raise CommandError(f"cannot write {picture}: {exc.strerror or exc}") from exc
            print(f"{'timeline' if command == 'demo' else 'plot'}: {picture}",
                  file=sys.stderr if command == "demo" else sys.stdout)
        if summary is not None:
            return _beside_the_motivating_program(summary, merge_json)
    return 0


def _beside_the_motivating_program(summary_path: pathlib.Path, as_json: bool) -> int:
    """Runs the motivating program on the demo's sizes and prints it beside gpupool's figures
    (in the JSON object with --json); 1 when its results differ from NumPy's."""
    import json

    from . import _motivating

    with open(summary_path, encoding="utf-8") as f:
        summary = json.load(f)
    try:
        result = _motivating.compare(summary)
    except _motivating.WrongResult as wrong:
        sys.stdout.flush()
        print(f"gpupool demo: {wrong}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({**summary, "motivating_program": result}))
    elif "skipped" in result:
        print(_motivating.skipped_line(result["skipped"]))
    else:
        print("\n".join(_motivating.report_lines(summary, result)))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The console script's entry point."""
    try:
        return run(sys.argv[1:] if argv is None else argv)
    except CommandError as exc:
        sys.stdout.flush()
        print(f"gpupool: {exc}", file=sys.stderr)
        return 2
