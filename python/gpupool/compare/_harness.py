"""Timing, checking and recording of one comparison run.

A variant is a callable that does the whole workload once and returns its output. It is run once
as a warm-up and its output checked; only then are the timed repeats run, and the last repeat's
output is checked again. A variant whose output is wrong at either check is FAILED and none of
its times are kept. A variant that cannot run here (a library or a GPU is missing) is SKIPPED
with the reason.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

OK, SKIPPED, FAILED = "ok", "skipped", "FAILED"

# How a variant stands in its table: the motivating program (the anchor of the "x motivating"
# column), an alternative to gpupool, gpupool itself, or a measured limit or floor (not work).
ANCHOR, ALTERNATIVE, GPUPOOL, LIMIT = "anchor", "alternative", "gpupool", "limit"

# Units, and whether a larger figure is better.
UNITS = {"ms": False, "us": False, "GB/s": True, "tasks/s": True, "x": True}


DEBUG = False  # print the traceback of a variant that fails (gpupool compare --debug)


class Skip(Exception):
    """Raised by a variant's setup: it cannot run here, for the reason given."""


class WrongResult(Exception):
    """Raised by a check: the output differs from the reference."""


@dataclasses.dataclass
class Result:
    workload: str
    variant: str
    kind: str
    status: str
    unit: str = ""
    figure: Optional[float] = None
    repeats_s: List[float] = dataclasses.field(default_factory=list)
    reason: str = ""
    settings: Dict[str, Any] = dataclasses.field(default_factory=dict)
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def as_json(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Timing:
    """How many times to run each variant: one warm-up, then at least ``min_repeat`` and at
    most ``repeat`` timed runs, stopping early once a variant has spent ``seconds`` timing."""

    repeat: int = 7
    min_repeat: int = 3
    seconds: float = 2.0


def figure_from_seconds(unit: str, seconds: float, amount: float) -> float:
    """The figure a run of ``seconds`` reaches: ms for times, else ``amount`` per second
    (``amount`` is GB for GB/s and tasks for tasks/s)."""
    if unit == "ms":
        return seconds * 1e3
    return amount / seconds if seconds > 0 else float("inf")


def measure(workload: str, variant: str, kind: str, unit: str, amount: float,
            setup: Callable[[], Callable[[], Any]], check: Callable[[Any], None],
            timing: Timing, settings: Optional[Dict[str, Any]] = None,
            teardown: Optional[Callable[[], None]] = None) -> Result:
    """Runs one variant: ``setup()`` returns the function doing the workload once (or raises
    Skip); its output goes through ``check`` (which raises WrongResult) after the warm-up and
    after the last timed run. Never raises for the variant's own failures: they become FAILED."""
    result = Result(workload, variant, kind, OK, unit, settings=dict(settings or {}))
    try:
        run = setup()
    except Skip as why:
        result.status, result.reason = SKIPPED, str(why)
        return result
    except Exception as error:  # a library that imports but cannot start (no driver, ...)
        result.status, result.reason = SKIPPED, _describe(error)
        return result
    try:
        try:
            check(run())
        except WrongResult as wrong:
            result.status, result.reason = FAILED, f"wrong result: {wrong}"
            return result
        times: List[float] = []
        started = time.perf_counter()
        while len(times) < timing.repeat:
            t0 = time.perf_counter()
            out = run()
            times.append(time.perf_counter() - t0)
            if len(times) >= timing.min_repeat and time.perf_counter() - started > timing.seconds:
                break
            if len(times) < timing.repeat:
                del out
        try:
            check(out)
        except WrongResult as wrong:
            result.status, result.reason = FAILED, f"wrong result in a timed run: {wrong}"
            return result
    except Skip as why:
        result.status, result.reason = SKIPPED, str(why)
        return result
    except Exception as error:
        result.status, result.reason = FAILED, _describe(error)
        if DEBUG:
            traceback.print_exc()
        return result
    finally:
        if teardown is not None:
            try:
                teardown()
            except Exception:
                pass
    result.repeats_s = [round(t, 9) for t in times]
    result.figure = figure_from_seconds(unit, statistics.median(times), amount)
    return result


@dataclasses.dataclass
class Contender:
    """One variant of an interleaved measurement (measure_interleaved): as measure's arguments,
    ``setup()`` returning the function doing the workload once (or raising Skip)."""

    workload: str
    variant: str
    kind: str
    unit: str
    amount: float
    setup: Callable[[], Callable[[], Any]]
    check: Callable[[Any], None]
    settings: Dict[str, Any] = dataclasses.field(default_factory=dict)


def measure_interleaved(contenders: Sequence[Contender], timing: Timing,
                        teardown: Optional[Callable[[], None]] = None) -> List[Result]:
    """Measures variants of one workload in turn, round after round, so that a host whose speed
    drifts within a run (as GPU hosts were seen to, by a fifth and more between minutes) moves
    them alike and the ratio of their figures holds. Each round runs every variant still in once,
    each round starting one variant later than the round before (0, 1, 2; then 1, 2, 0; ...),
    so that each goes first in turn (the cyclic order stays: with two, rounds alternate).

    Each variant is set up, warmed up and checked first, as in measure; one that cannot run, is
    wrong or raises drops out with that status and the others go on. At least ``min_repeat`` and
    at most ``repeat`` rounds run, stopping early once they have taken ``seconds`` per variant.
    Each variant's last output is checked again. Returns one Result per contender, in the order
    given, each naming the others in ``extra["interleaved_with"]``; ``teardown`` runs at the end
    whatever happened. Never raises for the variants' own failures."""
    n = len(contenders)
    results = [Result(c.workload, c.variant, c.kind, OK, c.unit, settings=dict(c.settings),
                      extra={"interleaved_with": [o.variant for o in contenders if o is not c]})
               for c in contenders]
    runs: List[Optional[Callable[[], Any]]] = [None] * n
    times: List[List[float]] = [[] for _ in range(n)]
    last: List[Any] = [None] * n

    def drop(i: int, status: str, reason: str) -> None:
        results[i].status, results[i].reason = status, reason
        runs[i], last[i] = None, None
        if status == FAILED and DEBUG:
            traceback.print_exc()

    def attempt(i: int, what: str, step: Callable[[], None]) -> None:
        try:
            step()
        except Skip as why:
            drop(i, SKIPPED, str(why))
        except WrongResult as wrong:
            drop(i, FAILED, f"{what}: {wrong}")
        except Exception as error:
            drop(i, FAILED, _describe(error))

    try:
        for i, c in enumerate(contenders):
            try:
                runs[i] = c.setup()
            except Skip as why:
                drop(i, SKIPPED, str(why))
                continue
            except Exception as error:  # a library that imports but cannot start
                drop(i, SKIPPED, _describe(error))
                continue
            run = runs[i]
            assert run is not None
            # Called at once, so the loop's names are the ones meant.
            attempt(i, "wrong result", lambda: c.check(run()))

        def timed(i: int) -> None:
            last[i] = None  # its output of the round before is let go first
            run = runs[i]
            assert run is not None
            t0 = time.perf_counter()
            out = run()
            times[i].append(time.perf_counter() - t0)
            last[i] = out

        started, rounds = time.perf_counter(), 0
        while rounds < timing.repeat and any(r is not None for r in runs):
            for i in ((rounds + k) % n for k in range(n)):
                if runs[i] is not None:
                    attempt(i, "failed in a timed run", lambda: timed(i))
            rounds += 1
            still_in = sum(r is not None for r in runs)
            if rounds >= timing.min_repeat and \
                    time.perf_counter() - started > timing.seconds * max(1, still_in):
                break
        for i, c in enumerate(contenders):
            if runs[i] is not None:
                attempt(i, "wrong result in a timed run", lambda: c.check(last[i]))
    finally:
        last = [None] * n
        if teardown is not None:
            try:
                teardown()
            except Exception:
                pass
    for i, (c, result) in enumerate(zip(contenders, results)):
        if result.status == OK and times[i]:
            result.repeats_s = [round(t, 9) for t in times[i]]
            result.figure = figure_from_seconds(c.unit, statistics.median(times[i]), c.amount)
        elif result.status == OK:  # no timed run (repeat 0): nothing to report
            result.status, result.reason = SKIPPED, "no timed run"
    return results


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def skipped(workload: str, variant: str, kind: str, reason: str, unit: str = "") -> Result:
    return Result(workload, variant, kind, SKIPPED, unit, reason=reason)


def faster(unit: str, a: Optional[float], b: Optional[float]) -> float:
    """How many times better figure ``a`` is than ``b`` (above 1: ``a`` is better); NaN where
    either is missing or zero."""
    if not a or not b:
        return float("nan")
    return a / b if UNITS.get(unit, True) else b / a


def best(results: Sequence[Result], kinds: Tuple[str, ...]) -> Optional[Result]:
    """The best measured result of the given kinds (by figure, in the unit's direction)."""
    measured = [(r.figure, r) for r in results
                if r.kind in kinds and r.status == OK and r.figure]
    if not measured:
        return None
    larger = UNITS.get(measured[0][1].unit, True)
    pick = max if larger else min
    return pick(measured, key=lambda pair: pair[0])[1]
