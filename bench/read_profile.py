"""Reads a CPU profile in gperftools' format (CPUPROFILE, libprofiler) taken on another machine:
`scripts/gpu measure --profile` takes them on a GPU machine without perf and writes the raw
profiles beside the program and that machine's libraries. pprof there may not name the program's
addresses, and pprof here names the other machine's libraries by this machine's copies; this
reads the samples and their memory map itself and names each address from the file it came from:
the program through addr2line (exact), a library given with --lib through the nearest symbol of
its symbol table (marked ~, approximate: a stripped library names only the functions it
exports), anything else by the library's name.

    python3 bench/read_profile.py w4.prof w4.bin [--lib libc.so.6] [--top 40] [--under NAME]
                                  [--also w4.prof.1]

Prints the functions where samples landed (flat) and the functions on the stack of most samples
(cumulative); with --under, the callees below the outermost frame whose name contains NAME.
"""

import argparse
import bisect
import collections
import os
import struct
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

Region = Tuple[int, int, int, str]  # start, end, file offset, path


def read(path: str) -> Tuple[List[Tuple[int, Tuple[int, ...]]], List[Region]]:
    """The samples (count, stack of addresses, innermost first) and the memory map."""
    data = open(path, "rb").read()
    header = struct.unpack_from("<5Q", data, 0)
    if header[0] != 0 or header[1] != 3:
        raise SystemExit(f"{path}: not a gperftools CPU profile (64-bit)")
    pos = 8 * (2 + header[1])
    samples = []
    while True:
        count, depth = struct.unpack_from("<2Q", data, pos)
        pos += 16
        stack = struct.unpack_from(f"<{depth}Q", data, pos)
        pos += 8 * depth
        if count == 0 and depth == 1 and stack[0] == 0:
            break
        samples.append((count, stack))
    regions: List[Region] = []
    for line in data[pos:].decode(errors="replace").splitlines():
        parts = line.split()
        if len(parts) < 6 or "-" not in parts[0]:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        regions.append((start, end, int(parts[2], 16), parts[5]))
    return samples, regions


class Names:
    def __init__(self, regions: Sequence[Region], program: str, libs: Sequence[str]) -> None:
        self.regions = sorted(regions)
        self.starts = [r[0] for r in self.regions]
        name = os.path.basename(program)
        # The program is the file of that name in the map, else (renamed here) the lowest file
        # mapped that is neither a library nor a device.
        files = [r[3] for r in self.regions
                 if r[3].startswith("/") and ".so" not in r[3] and not r[3].startswith("/dev/")]
        self.program_path = next((f for f in files if os.path.basename(f) == name),
                                 files[0] if files else name)
        self.program = program
        self.program_base = min((r[0] - r[2] for r in self.regions
                                 if r[3] == self.program_path), default=0)
        self.libs: Dict[str, Tuple[List[int], List[str]]] = {}
        for lib in libs:
            symbols = []
            # The symbol table where the library kept it (every function, demangled), else
            # the exported ones.
            for table in (["--defined-only", "-C"], ["-D", "--defined-only", "-C"]):
                out = subprocess.run(["nm", *table, lib], capture_output=True, text=True,
                                     check=False).stdout
                for row in out.splitlines():
                    fields = row.split(maxsplit=2)
                    if len(fields) == 3 and fields[1] in "TtWi":
                        symbols.append((int(fields[0], 16), fields[2].split("@")[0]))
                if symbols:
                    break
            if not symbols:
                print(f"read_profile: no function symbols in {lib} (not a library nm reads?); "
                      "its addresses are named by its file's name", file=sys.stderr)
            symbols.sort()
            self.libs[os.path.basename(lib)] = ([a for a, _ in symbols], [n for _, n in symbols])
        self.cache: Dict[int, str] = {}

    def region(self, pc: int) -> Optional[Region]:
        i = bisect.bisect_right(self.starts, pc) - 1
        if i >= 0 and self.regions[i][0] <= pc < self.regions[i][1]:
            return self.regions[i]
        return None

    def resolve_program(self, pcs: Sequence[int]) -> None:
        mine = sorted({pc for pc in pcs if (r := self.region(pc)) and r[3] == self.program_path})
        if not mine or not os.path.exists(self.program):
            return  # without the program here, its addresses are named by its file's name
        out = subprocess.run(["addr2line", "-f", "-C", "-e", self.program]
                             + [f"{pc - self.program_base:x}" for pc in mine],
                             capture_output=True, text=True, check=True).stdout.splitlines()
        for i, pc in enumerate(mine):
            self.cache[pc] = out[2 * i] if 2 * i < len(out) else "?"

    def __call__(self, pc: int) -> str:
        if pc in self.cache:
            return self.cache[pc]
        r = self.region(pc)
        if r is None:
            return f"0x{pc:x}"
        lib = os.path.basename(r[3])
        if lib in self.libs:
            addresses, names = self.libs[lib]
            i = bisect.bisect_right(addresses, pc - r[0] + r[2]) - 1
            return f"~{names[i]} ({lib})" if i >= 0 else lib
        return lib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile")
    parser.add_argument("program", help="the profiled program (the file, as it ran)")
    parser.add_argument("--also", action="append", default=[],
                        help="another profile of the same run (a later span) whose samples "
                        "count too (repeatable)")
    parser.add_argument("--lib", action="append", default=[],
                        help="a shared library of the machine it ran on (repeatable)")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--under", default=None)
    parser.add_argument("--width", type=int, default=100)
    args = parser.parse_args()
    samples, regions = read(args.profile)
    for more in args.also:
        # A later span of one process: its samples added, its map (libraries loaded since
        # included) merged with the first's.
        more_samples, more_regions = read(more)
        samples += more_samples
        regions = sorted(set(regions) | set(more_regions))
    names = Names(regions, args.program, args.lib)
    names.resolve_program([pc for _, stack in samples for pc in stack])
    total = sum(count for count, _ in samples)
    if total == 0:
        raise SystemExit(f"{args.profile}: no samples")
    flat: "collections.Counter[str]" = collections.Counter()
    cumulative: "collections.Counter[str]" = collections.Counter()
    under: "collections.Counter[str]" = collections.Counter()
    under_total = 0
    for count, stack in samples:
        frames = [names(pc) for pc in stack]
        flat[frames[0]] += count
        for frame in set(frames):
            cumulative[frame] += count
        if args.under:
            hits = [i for i, f in enumerate(frames) if args.under in f]
            if hits:
                under_total += count
                below = frames[max(0, hits[-1] - 3):hits[-1]][::-1]
                under[" > ".join(f[:50] for f in below) or "(itself)"] += count

    def show(title: str, counter: "collections.Counter[str]", of: int) -> None:
        print(f"-- {title}")
        for frame, count in counter.most_common(args.top):
            print(f"{count:7d} {100 * count / of:5.1f}%  {frame[:args.width]}")

    print(f"{total} samples")
    show("flat: where samples landed", flat, total)
    show("cumulative: on the stack of", cumulative, total)
    if args.under:
        show(f"under {args.under} ({under_total} samples), the three frames below it", under,
             max(under_total, 1))


if __name__ == "__main__":
    main()
