# shellcheck shell=bash
# scripts/gpu paired: this tree against the baseline staged in .baseline/, in one run, so that a
# change is judged against its baseline on the same card at the same moment. Run through
# scripts/gpu, from the repository root.
set -uo pipefail
source scripts/lib/gpu-common.sh

usage() {
  cat <<'EOF'
usage: scripts/gpu paired [--out DIR] [--rounds N] [--workloads LIST] [--backend cuda|cpu]
                          [-- DEMO_ARGS...]
       scripts/gpu paired --python [--out DIR] [--rounds N] [--lanes LIST]
                          [--step-seconds N] [SCRIPT [ARGS...]]

Times this tree beside the commit staged in .baseline/ (scripts/stage-baseline
COMMIT), the two interleaved round after round, so that the machine's drift moves
both alike.

From C++ (the default): builds `gpupool` in build-base (the baseline) and
build-paired (this tree), then runs each workload with each build in turn (results
checked: a wrong result fails the run): W1, W2 and W4 through `gpupool demo`, W5
through gpupool_bench_w5 (the time of `map_on_device`; DEMO_ARGS do not apply):
  W1  5 x 1M float64 squared   W2  200 x 1M float64   W4  20,000 x 1,024 float64
  W5  2,000 x 16,384 float32, 2,048 dependent FMAs each (gpupool_bench_w5's defaults;
      with --backend cpu 40 x 1,000 and 64 FMAs, which check the script, not the speed)
Prints per workload the median over the rounds of each build's median and the
ratio this/baseline (time: below 1 is faster).

With --python: pip installs the package of the baseline and of this tree into
folders of their own and runs SCRIPT (a file of this tree; default
bench/w5_profile.py, W5 from Python; bench/map_window.py is the map window's
W2/W4 pair) under each, once per lane count with `--lanes N` and ARGS (default
--repeat 5). The baseline goes first in odd rounds and this tree in even ones.
SCRIPT checks its results and prints lines `LABEL  MEDIAN ms`; each label is
paired: each build's median over the rounds, the ratio this/baseline and in how
many rounds this tree was faster.

options:
  --out DIR          where the results go (default ./gpu-out; env OUT)
  --rounds N         interleaved rounds (default 5 from C++, 3 with --python;
                     env ROUNDS)
  --workloads LIST   from C++: which of W1,W2,W4,W5 (default all four; env WORKLOADS)
  --backend B        from C++: the demo's backend, cuda (default) or cpu, which
                     checks the script itself on any machine (env BACKEND)
  -- DEMO_ARGS       from C++: more arguments for every `gpupool demo` (env DEMO_ARGS)
  --python           a Python benchmark instead (see above)
  --lanes LIST       with --python: lane counts, comma-separated (default 16,8;
                     env LANES)
  --step-seconds N   with --python: time limit of each run of SCRIPT (default 150;
                     env STEP_SECONDS)
  SCRIPT, ARGS       with --python: env SCRIPT and SCRIPT_ARGS too
  -h, --help         this text

writes to $OUT:
  from C++:      paired.json (every run and the summary)
  with --python: paired-python.json
  logs.tar.gz    the rest, packed in one file (tar -xzf it): paired.jsonl,
                 build-base.log, build-paired.log; paired-python.jsonl,
                 run-BUILD-N-lanes-round-R.txt (each run's output), pip-base.log,
                 pip-this.log
EOF
}

python=0
rounds=${ROUNDS:-}
workloads=${WORKLOADS:-W1,W2,W4,W5}
backend=${BACKEND:-cuda}
lanes=${LANES:-16,8}
step=${STEP_SECONDS:-150}
demo_args=()
if [ -n "${DEMO_ARGS:-}" ]; then read -ra demo_args <<<"$DEMO_ARGS"; fi
script=${SCRIPT:-}
script_args=()
if [ -n "${SCRIPT_ARGS:-}" ]; then read -ra script_args <<<"$SCRIPT_ARGS"; fi
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --out) need_value "$1" $#; OUT=$2; shift ;;
    --rounds) need_value "$1" $#; rounds=$2; shift ;;
    --workloads) need_value "$1" $#; workloads=$2; shift ;;
    --backend) need_value "$1" $#; backend=$2; shift ;;
    --lanes) need_value "$1" $#; lanes=$2; shift ;;
    --step-seconds) need_value "$1" $#; step=$2; shift ;;
    --python) python=1 ;;
    --)
      shift
      [ $python = 0 ] || usage_error "paired: -- DEMO_ARGS is for the C++ comparison, not --python"
      demo_args=("$@")
      break
      ;;
    -*) usage_error "paired: unknown option '$1'" ;;
    *)
      [ $python = 1 ] || usage_error "paired: '$1': a SCRIPT goes after --python"
      script=$1
      shift
      script_args=("$@")
      break
      ;;
  esac
  shift
done
if [ -z "$rounds" ]; then
  rounds=5
  [ $python = 1 ] && rounds=3
fi
need_count --rounds "$rounds"
need_count --step-seconds "$step"
case $backend in cuda | cpu) ;; *) usage_error "paired: --backend must be cuda or cpu, not '$backend'" ;; esac
# Lists may be given with commas or spaces.
read -ra workload_list <<<"${workloads//,/ }"
read -ra lane_list <<<"${lanes//,/ }"
for w in "${workload_list[@]}"; do
  case $w in
    W1 | W2 | W4 | W5) ;;
    *) usage_error "paired: unknown workload '$w' (W1, W2, W4 or W5)" ;;
  esac
done
for n in "${lane_list[@]}"; do need_count --lanes "$n"; done
[ ${#workload_list[@]} -gt 0 ] || usage_error "paired: no workloads"
[ ${#lane_list[@]} -gt 0 ] || usage_error "paired: no lane counts"
if [ $python = 1 ] && [ -z "$script" ]; then
  script=bench/w5_profile.py
fi
if [ $python = 1 ] && [ ${#script_args[@]} -eq 0 ]; then
  script_args=(--repeat 5)
fi
[ $python = 0 ] || [ -f "$script" ] || usage_error "paired: no script '$script'"

start_run
# At exit: the medians kept as they are, every log and round in logs.tar.gz (pack_out).
trap 'pack_out paired.json paired-python.json' EXIT
[ -f .baseline/CMakeLists.txt ] || {
  echo "no .baseline/: run scripts/stage-baseline [COMMIT] here first"
  exit 1
}
echo "baseline: $(cat .baseline/BASELINE_COMMIT 2>/dev/null || echo unknown)"
# The baseline finds the dependencies this tree staged (scripts/stage-deps).
[ -d .deps ] && ln -sfn "$PWD/.deps" .baseline/.deps

if [ $python = 0 ]; then
  lean=(-DGPUPOOL_WITH_CUDA=ON -DGPUPOOL_BUILD_TESTS=OFF -DGPUPOOL_BUILD_TOOLS=ON)
  (cd .baseline && configure "$OLDPWD/build-base" "${lean[@]}") || exit 1
  configure build-paired "${lean[@]}" || exit 1
  # gpupool_bench_w5 only where W5 is timed: a baseline may predate it.
  targets=(gpupool_cli)
  [[ " ${workload_list[*]} " == *" W5 "* ]] && targets+=(gpupool_bench_w5)
  # Both at once: each build's serial steps (configure checks, the longest nvcc files, the link)
  # overlap the other's parallel ones, which saves device time.
  waits=()
  for build in build-base build-paired; do
    cmake --build "$build" -j "$jobs" --target "${targets[@]}" >"$OUT/$build.log" 2>&1 &
    waits+=("$!" "$OUT/$build.log")
  done
  await_builds "${waits[@]}" || exit 1

  # w5_line BUILD: W5 from that build as the demo's JSON would give it ({"median_ms": ...}),
  # from gpupool_bench_w5's map_on_device line; the bench exits non-zero on a wrong result.
  w5_line() {
    local text
    local shape=()
    [ "$backend" = cpu ] && shape=(--chunks 40 --size 1000 --fmas 64)
    text=$("$1/bench/gpupool_bench_w5" --backend "$backend" "${shape[@]}" --repeat 10) || return 1
    python3 -c '
import json, re, sys
m = re.search(r"map_on_device\s+([0-9.]+) ms", sys.stdin.read())
if not m:
    sys.exit("no map_on_device line")
print(json.dumps({"median_ms": float(m.group(1)), "wrong": 0}))' <<<"$text"
  }

  results="$OUT/paired.jsonl"
  : >"$results"
  for round in $(seq "$rounds"); do
    for w in "${workload_list[@]}"; do
      case $w in
        W1) shape=(--chunks 5 --size 1048576 --repeat 30) ;;
        W2) shape=(--chunks 200 --size 1048576 --repeat 5) ;;
        W4) shape=(--chunks 20000 --size 1024 --repeat 10) ;;
        W5) shape=() ;;
      esac
      for build in build-base build-paired; do
        if [ "$w" = W5 ]; then
          line=$(w5_line "$build") || { echo "FAIL: $build $w"; exit 1; }
        else
          line=$("$build/tools/gpupool" demo --backend "$backend" "${demo_args[@]}" \
            "${shape[@]}" --json) || { echo "FAIL: $build $w"; exit 1; }
        fi
        printf '{"round": %s, "workload": "%s", "build": "%s", "result": %s}\n' \
          "$round" "$w" "$build" "$line" >>"$results"
      done
    done
  done
  python3 - "$results" "$OUT/paired.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
bad = [r for r in rows if r["result"].get("wrong", 0)]
if bad:
    sys.exit(f"FAIL: wrong results in {len(bad)} runs")
summary = {}
print(f"{'workload':8} {'baseline ms':>12} {'this ms':>10} {'this/baseline':>14}")
for w in sorted({r["workload"] for r in rows}):
    med = {b: statistics.median(r["result"]["median_ms"] for r in rows
                                if r["workload"] == w and r["build"] == b)
           for b in ("build-base", "build-paired")}
    ratio = med["build-paired"] / med["build-base"]
    summary[w] = {"baseline_ms": med["build-base"], "this_ms": med["build-paired"], "ratio": ratio}
    print(f"{w:8} {med['build-base']:12.3f} {med['build-paired']:10.3f} {ratio:14.3f}")
json.dump({"rows": rows, "summary": summary}, open(sys.argv[2], "w"), indent=1)
PY
  exit $?
fi

# --python: each build's package in a folder of its own.
[ -f .baseline/pyproject.toml ] || { echo "no pyproject.toml in .baseline/"; exit 1; }
base_site=$(mktemp -d /tmp/gpupool-base.XXXXXX) || exit 1
this_site=$(mktemp -d /tmp/gpupool-this.XXXXXX) || exit 1
trap 'rm -rf "$base_site" "$this_site"; pack_out paired.json paired-python.json' EXIT
# Both at once, as the C++ builds above.
(cd .baseline && install_python "$base_site" "$OUT/pip-base.log") &
base_pid=$!
install_python "$this_site" "$OUT/pip-this.log" &
await_builds "$base_pid" "$OUT/pip-base.log" "$!" "$OUT/pip-this.log" || exit 1
# Each build's runs must import that build's package, not one installed elsewhere.
for site in "$base_site" "$this_site"; do
  imported=$(PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 -c \
    'import gpupool; print(gpupool.__file__)') || exit 1
  case $imported in
    "$site"/*) echo "imports $imported" ;;
    *)
      echo "FAIL: with $site first on PYTHONPATH, gpupool comes from $imported"
      exit 1
      ;;
  esac
done

results="$OUT/paired-python.jsonl"
: >"$results"
for round in $(seq "$rounds"); do
  for n in "${lane_list[@]}"; do
    order=(base this)
    [ $((round % 2)) -eq 0 ] && order=(this base)
    for build in "${order[@]}"; do
      site=$base_site
      [ "$build" = this ] && site=$this_site
      log="$OUT/run-$build-$n-lanes-round-$round.txt"
      PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} timeout "$step" \
        python3 "$script" --lanes "$n" "${script_args[@]}" >"$log" 2>&1 || {
        echo "FAIL: $build, $n lanes, round $round"
        tail -20 "$log"
        exit 1
      }
      python3 - "$log" "$round" "$n" "$build" >>"$results" <<'PY' || exit 1
import json, re, sys
text = open(sys.argv[1]).read()
times = {m.group(1).strip(): float(m.group(2))
         for m in re.finditer(r"^\s*(\S.*?)\s+([0-9.]+) ms", text, re.M)}
if not times:
    sys.exit(f"FAIL: no 'LABEL  N ms' line in {sys.argv[1]}")
print(json.dumps({"round": int(sys.argv[2]), "lanes": int(sys.argv[3]), "build": sys.argv[4],
                  "ms": times}))
PY
    done
  done
done
python3 - "$results" "$OUT/paired-python.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
summary = {}
print(f"{'lanes':>5} {'what':<28} {'baseline ms':>12} {'this ms':>9} {'this/baseline':>14}")
for lanes in sorted({r["lanes"] for r in rows}, reverse=True):
    mine = [r for r in rows if r["lanes"] == lanes]
    labels = [l for l in mine[0]["ms"] if all(l in r["ms"] for r in mine)]
    for label in labels:
        med = {b: statistics.median(r["ms"][label] for r in mine if r["build"] == b)
               for b in ("base", "this")}
        faster = sum(t["ms"][label] < b["ms"][label] for t in mine for b in mine
                     if t["round"] == b["round"] and t["build"] == "this"
                     and b["build"] == "base")
        summary.setdefault(lanes, {})[label] = {
            "baseline_ms": med["base"], "this_ms": med["this"],
            "ratio": med["this"] / med["base"], "rounds_faster": faster}
        print(f"{lanes:5} {label:<28} {med['base']:12.2f} {med['this']:9.2f} "
              f"{med['this'] / med['base']:14.3f}  (faster in {faster} of {len(mine) // 2} rounds)")
json.dump({"rows": rows, "summary": summary}, open(sys.argv[2], "w"), indent=1)
PY
