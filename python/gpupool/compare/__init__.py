"""gpupool compare: gpupool beside every alternative on this machine, in one run.

    python -m gpupool.compare --json compare.json --plot compare.png

For each workload (W1-W5, W6 and W6c on two or more GPUs, W8) it runs the motivating program
(CuPy in a ThreadPoolExecutor), careful CuPy and PyTorch, NumPy on the CPU, a hand-written C++
pipeline, gpupool from C++ and from Python (defaults, and the best of a small lanes x
chunk_bytes sweep), and measures the machine's own limits. Every variant's output is checked
against NumPy before its time counts; variants that cannot run here are listed as skipped with
the reason. See docs/compare.md.

Benchmarks outside the package take the workloads' checks, kernels and timing from
:mod:`gpupool.compare.harness`, the one public module here besides this one.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from ._workloads import Comparison

__all__ = ["main", "parse_args", "run"]


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    from .._ext import BACKENDS
    from ._workloads import WORKLOADS

    parser = argparse.ArgumentParser(
        prog="gpupool compare",
        description="Compare gpupool with the motivating program, careful CuPy/PyTorch, NumPy, "
                    "a hand-written C++ pipeline and the machine's limits, in one run.")
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated subset of %(default)s")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true",
                      help="tiny sizes (seconds, for tests and the CPU backend)")
    size.add_argument("--scale", type=float, default=1.0,
                      help="multiply the workloads' chunk counts (not W1's five) by this")
    parser.add_argument("--repeat", type=int, default=5,
                        help="timed runs per variant at most, after one warm-up (default 5)")
    parser.add_argument("--min-repeat", type=int, default=3,
                        help="timed runs per variant at least (default 3: with two, one slow run "
                             "makes half the median)")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="stop timing a variant past this many seconds once it has "
                             "--min-repeat runs (default 1.0)")
    parser.add_argument("--lanes-list", default="",
                        help="gpupool lanes per GPU to sweep (default 4,8,16; tiny 1,2,4)")
    parser.add_argument("--chunk-list", default="",
                        help="gpupool chunk_bytes to sweep, e.g. 1M,2M,8M (the default)")
    parser.add_argument("--host-lanes-list", default="",
                        help="also run W1, W2 and W4's maps with the defaults and each of these "
                             "numbers of host lanes, e.g. 4,8 (default: none)")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="gpupool backend (default: CUDA when a GPU is usable)")
    parser.add_argument("--bench-dir", default=None,
                        help="folder holding gpupool_bench_compare and gpupool_baseline_pipeline "
                             "(default: $GPUPOOL_BENCH_DIR, then build-gpu/bench or build/bench)")
    parser.add_argument("--program-timeout", type=float, default=120.0,
                        help="seconds each run of a C++ program may take")
    parser.add_argument("--json", dest="json_path", default=None, help="write the JSON here")
    parser.add_argument("--plot", default=None, help="draw the summary plot here (.png/.svg/.pdf)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--debug", action="store_true",
                        help="print tracebacks of variants that fail")
    args = parser.parse_args(argv)
    chosen = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in chosen if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
    if args.repeat < 1 or args.min_repeat < 1 or args.seconds <= 0 or args.scale <= 0:
        parser.error("--repeat, --min-repeat, --seconds and --scale must be positive")
    args.workload_list = [w for w in WORKLOADS if w in chosen]
    # The outputs are written after a run of minutes: a path that cannot take them is refused
    # now, before any work, as the other commands do.
    from .._outputs import CommandError, check_writable, picture_type

    try:
        if args.json_path:
            check_writable(args.json_path)
        if args.plot:
            picture_type("--plot", args.plot)
            check_writable(args.plot)
    except CommandError as exc:
        parser.error(str(exc))
    return args


def run(args: argparse.Namespace) -> Tuple[Comparison, Dict[str, Any], Dict[str, Any]]:
    """Runs the comparison; returns (comparison, tables, JSON document)."""
    from . import _harness, _report
    from ._workloads import Comparison

    _harness.DEBUG = args.debug
    def progress(line: str) -> None:
        if not args.quiet:
            print(line, flush=True)

    started = time.time()
    comparison = Comparison(args, progress)
    progress(f"gpupool compare: backend {comparison.backend}, {comparison.gpus} GPU(s), "
             f"{'tiny sizes' if args.tiny else f'scale {args.scale:g}'}, up to {args.repeat} "
             f"timed runs per variant")
    comparison.all(args.workload_list, args.bench_dir)
    tables = _report.summarise(comparison)
    document = {
        "machine": _report.machine(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        "seconds": round(time.time() - started, 1),
        "settings": {
            "argv": sys.argv[1:], "backend": comparison.backend, "gpus": comparison.gpus,
            "sizes": comparison.size, "workloads": args.workload_list,
            "timing": vars(comparison.timing), "sweep_timing": vars(comparison.sweep_timing),
            "gpupool_defaults": {"lanes": comparison.default_lanes,
                                 "chunk_bytes": comparison.default_chunk},
            "sweep": {"lanes": comparison.lanes_list, "chunk_bytes": comparison.chunk_list},
            "best_settings": comparison.best_settings,
            "programs": {name: (found or why) for name, (found, why) in comparison.cpp.items()},
        },
        "limits": comparison.limits,
        "tables": tables,
        "results": [r.as_json() for r in comparison.results],
        "sweeps": comparison.sweeps,
    }
    return comparison, tables, document


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: prints the table; writes --json and --plot. Returns 1 when any variant
    FAILED (a wrong result or an error), else 0."""
    from . import _report
    from ._harness import FAILED
    from ._workloads import describe

    args = parse_args(argv)
    comparison, tables, document = run(args)
    print(_report.table_text(tables, lambda w: describe(w, comparison.size)), flush=True)
    if args.json_path:
        _report.write_json(args.json_path, document)
        print(f"wrote {args.json_path}")
    if args.plot:
        try:
            _report.plot(tables, args.plot, f"gpupool compare ({comparison.backend}, "
                         f"{comparison.gpus} GPU(s)): {document['machine'].get('cpu', '')}")
            print(f"wrote {args.plot}")
        except ImportError:
            print("no plot: matplotlib is not installed", file=sys.stderr)
    failed = [r for r in comparison.results if r.status == FAILED]
    for r in failed:
        print(f"FAILED: [{r.workload}] {r.variant}: {r.reason}", file=sys.stderr)
    return 1 if failed else 0
