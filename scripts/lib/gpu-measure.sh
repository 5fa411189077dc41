# shellcheck shell=bash
# scripts/gpu measure: the measured results a release keeps (bench/results/, docs/images/). Run
# through scripts/gpu, from the repository root.
set -uo pipefail
source scripts/lib/gpu-common.sh

usage() {
  cat <<'EOF'
usage: scripts/gpu measure [--out DIR] [--workloads LIST] [--lanes LIST] [--chunks LIST]
                           [--no-compare] [--images] [--small-tasks] [--shared] [--priority]
                           [--dask] [--dask-model] [--profile] [--host-lanes LIST]
                           [--step-seconds N] [-- COMPARE_ARGS...]

Builds in build-measure (no tests, no NVTX ranges), pip installs the package, then:
  1. `gpupool info --tuning remeasure`: the sweep the default lanes and chunk size
     come from, and how long it took
  2. `gpupool compare` on every workload (or --workloads), sweeping lanes x chunk
     sizes beside the defaults: gpupool from Python and C++ against the motivating
     program, careful CuPy/PyTorch, NumPy and a hand-written CUDA pipeline
     (docs/compare.md); --no-compare leaves it out, for the optional steps alone
Optional steps, each bounded by --step-seconds:
  --images        the pictures of docs/images: W2's timelines with 1 and 4 lanes and
                  the cost of tracing (bench/timelines.py), and `gpupool bench` over
                  lanes x chunk sizes with its plot
  --small-tasks   gpupool_bench_small_tasks: W4's shape from C++ (map, submit loop,
                  one task at a time) over 1 and all GPUs x 8, 16 lanes, with and
                  without the in-flight budget, and on GPU 0 as 1 and as 2 devices
  --shared        GPU 0 as two devices against one: W2 and W4 from Python
                  (bench/shared_devices.py)
  --priority      a tiny urgent task behind a W2 map against its latency on an idle
                  executor, and the map's throughput with urgent tasks every
                  millisecond (bench/priority_latency.py, W2's sizes): with the
                  defaults, with 1 MiB chunks, and with 4 lanes (three runs, each
                  bounded by --step-seconds)
  --dask          where dask and distributed import: bench/dask_gpus.py over every
                  GPU (two or more), and on GPU 0 alone with one worker against one
                  process and two sharing it against two processes sharing it (W2
                  and W4 sizes), each beside Dask's floor for its graph; those at W2's
                  size also traced (each worker's pool stats, and where the wall time
                  went: the pool busy, a block queued, Python in a task, Dask between
                  tasks)
  --dask-model    where dask and distributed import: bench/dask_scaling.py and
                  bench/dask_cluster_model.py --pools-at-once (CPU backend; the model's
                  step may take 12 x --step-seconds)
                  Both install dask and distributed from .deps/wheels
                  (scripts/stage-wheels) where they do not import.
  --host-lanes LIST  W4's shape with that many host lanes beside GPU 0's lanes (each
                  count in LIST, such as 4,8): from C++ (gpupool_bench_small_tasks,
                  map) and from Python (bench/python_task_cost.py, the square's map
                  and submit loop), each beside the same without host lanes, saying
                  what share of the calls ran on the host; with the compare step,
                  also its --host-lanes-list (W1, W2 and W4's maps)
  --profile       with .deps/profiler/ (scripts/stage-profiler): CPU profiles
                  (gperftools) of the timed rounds of W4's shape from C++ and of the
                  Python submit loop and map of bench/python_task_cost.py (the
                  extension installed with its symbol table), with the files
                  bench/read_profile.py needs to read them elsewhere

options:
  --out DIR          where the results go (default ./gpu-out; env OUT)
  --workloads LIST   gpupool compare's workloads (default: every one)
  --lanes LIST       lanes per GPU swept by compare (default 8,16; env COMPARE_LANES)
  --chunks LIST      chunk sizes swept by compare (default 2M,4M; env COMPARE_CHUNKS)
  --step-seconds N   time limit of each optional step (default 150; env STEP_SECONDS)
  -- COMPARE_ARGS    more arguments for `gpupool compare` (python -m gpupool.compare
                     --help lists them)
  -h, --help         this text

writes to $OUT:
  measure.txt        everything printed, step by step
  compare.json, compare.png, compare.txt (the table) (step 2)
  --images also:     timeline_1lane.png, timeline_4lanes.png, bench.png
  logs.tar.gz        everything else, packed in one file (tar -xzf it): tuning.txt (step 1), compare.log,
                     build.log, pip.log;
    --images:        w2_trace.json, bench.json, bench.csv
    --small-tasks:   small_tasks.txt
    --shared:        shared_devices.txt, shared_devices.json
    --priority:      priority.txt
    --host-lanes:    host_lanes.txt
    --dask:          dask.txt
    --dask-model:    dask.txt, dask_cluster_model.json
    --profile:       w4.prof, w4.bin, submit.prof (.1, .2, .3: the loop's other
                     variants), map.prof (.1: after CuPy and PyTorch are imported),
                     python.bin, the extension module, libpython and libc of this
                     machine, profile.txt
EOF
}

workloads=""
lanes=${COMPARE_LANES:-8,16}
chunks=${COMPARE_CHUNKS:-2M,4M}
step=${STEP_SECONDS:-150}
images=0 small_tasks=0 shared=0 priority=0 dask=0 dask_model=0 profile=0 compare=1
host_lanes=
compare_args=()
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --out) need_value "$1" $#; OUT=$2; shift ;;
    --workloads) need_value "$1" $#; workloads=$2; shift ;;
    --lanes) need_value "$1" $#; lanes=$2; shift ;;
    --chunks) need_value "$1" $#; chunks=$2; shift ;;
    --step-seconds) need_value "$1" $#; step=$2; shift ;;
    --images) images=1 ;;
    --small-tasks) small_tasks=1 ;;
    --shared) shared=1 ;;
    --priority) priority=1 ;;
    --dask) dask=1 ;;
    --dask-model) dask_model=1 ;;
    --no-compare) compare=0 ;;
    --profile) profile=1 ;;
    --host-lanes) need_value "$1" $#; host_lanes=$2; shift ;;
    --) shift; compare_args=("$@"); break ;;
    *) usage_error "measure: unknown option '$1'" ;;
  esac
  shift
done
need_count --step-seconds "$step"
[ -n "$workloads" ] && compare_args=(--workloads "$workloads" "${compare_args[@]}")
if [ -n "$host_lanes" ]; then
  [[ $host_lanes =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] ||
    usage_error "measure: --host-lanes takes counts separated by commas, such as 4,8"
  compare_args=(--host-lanes-list "$host_lanes" "${compare_args[@]}")
fi

start_run
export PYTHONUNBUFFERED=1 GPUPOOL_QUIET=1
log="$OUT/measure.txt"
: >"$log"
say() { echo "$*" | tee -a "$log"; }
status=0
# step_done RC WHAT: a step's exit status RC; a failure, or a run past its time, is said and
# fails the run.
step_done() {
  [ "$1" -eq 0 ] && return
  status=1
  if [ "$1" -eq 124 ]; then
    say "FAIL: $2 ran past its $step s (--step-seconds)"
  else
    say "FAIL: $2 exited $1"
  fi
}
gpus=$(gpu_count)

say "commit: $(tree_commit)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$log"
say "== build (sm_$GPUPOOL_CUDA_ARCHITECTURES), $gpus GPU(s), $(nproc) cores"
# Its own build folder, with no NVTX ranges (they cost time in every task) and no tests.
configure build-measure -DGPUPOOL_WITH_CUDA=ON -DGPUPOOL_BUILD_TESTS=OFF -DGPUPOOL_WITH_NVTX=OFF \
  -DGPUPOOL_BUILD_TOOLS=ON || exit 1
cmake --build build-measure -j "$jobs" --target gpupool_cli --target gpupool_bench_compare \
  --target gpupool_baseline_pipeline --target gpupool_bench_small_tasks >"$OUT/build.log" 2>&1 ||
  { tail -50 "$OUT/build.log"; exit 1; }
pydir=$(mktemp -d /tmp/gpupool-python.XXXXXX) || exit 1
# At exit: the tables, the plots and this run's log kept as they are, the rest in logs.tar.gz.
keep=(measure.txt compare.txt compare.json compare.png)
[ $images = 1 ] && keep+=(timeline_1lane.png timeline_4lanes.png bench.png)
trap 'rm -rf "$pydir"; pack_out "${keep[@]}"' EXIT
# A profile names the extension's functions by its symbol table, which a release build strips.
unstripped=()
[ $profile = 1 ] && unstripped=(-Cinstall.strip=false -Ccmake.define.GPUPOOL_PYTHON_SYMBOLS=ON)
install_python "$pydir" "$OUT/pip.log" "${unstripped[@]}" || exit 1
export PYTHONPATH=$pydir${PYTHONPATH:+:$PYTHONPATH}

say "== 1. the tuning sweep (gpupool info --tuning remeasure)"
start=$(date +%s.%N)
build-measure/tools/gpupool info --tuning remeasure 2>&1 | tee "$OUT/tuning.txt" | tee -a "$log"
step_done "${PIPESTATUS[0]}" "gpupool info --tuning remeasure"
say "gpupool info --tuning remeasure took $(seconds_since "$start") s" | tee -a "$OUT/tuning.txt"

if [ $compare = 1 ]; then
  say "== 2. gpupool compare (lanes $lanes x chunks $chunks swept)"
  # Progress and table in compare.log; the table alone (from the machine's limits on) in
  # compare.txt.
  python3 -m gpupool.compare --bench-dir build-measure/bench --lanes-list "$lanes" \
    --chunk-list "$chunks" --json "$OUT/compare.json" --plot "$OUT/compare.png" \
    "${compare_args[@]}" 2>&1 | tee "$OUT/compare.log" | tee -a "$log"
  step_done "${PIPESTATUS[0]}" "gpupool compare"
  sed -n '/^limits:/,$p' "$OUT/compare.log" | grep -v '^wrote ' >"$OUT/compare.txt"
  [ -s "$OUT/compare.txt" ] || { say "FAIL: no table in compare.log"; status=1; }
fi

if [ $images = 1 ]; then
  say "== W2 timelines with 1 and 4 lanes, and the cost of tracing (bench/timelines.py)"
  timeout "$step" python3 bench/timelines.py "$OUT" 2>&1 | tee -a "$log"
  step_done "${PIPESTATUS[0]}" "bench/timelines.py"
  say "== gpupool bench: lanes x chunk size, with its plot"
  timeout "$step" python3 -m gpupool bench --lanes-list 1,2,4,8 \
    --sizes 64K,128K,256K,512K,1M,2M,4M,8M,16M,32M,64M --total 512M --repeat 3 \
    --csv "$OUT/bench.csv" --json "$OUT/bench.json" --plot "$OUT/bench.png" 2>&1 | tee -a "$log"
  step_done "${PIPESTATUS[0]}" "gpupool bench"
fi

if [ $small_tasks = 1 ]; then
  say "== tiny tasks from C++ over 1 and $gpus GPU(s) (gpupool_bench_small_tasks)"
  devices=1
  [ "$gpus" -ge 2 ] && devices="1,$gpus"
  for budget in default none; do
    echo "-- in-flight budget: $budget" | tee -a "$OUT/small_tasks.txt" >>"$log"
    timeout "$step" build-measure/bench/gpupool_bench_small_tasks --backend cuda \
      --devices "$devices" --lanes 8,16 --modes map,submit,one --budget "$budget" 2>&1 |
      tee -a "$OUT/small_tasks.txt" | tee -a "$log"
    step_done "${PIPESTATUS[0]}" "gpupool_bench_small_tasks --budget $budget"
  done
  echo "-- GPU 0 as 1 and as 2 devices" | tee -a "$OUT/small_tasks.txt" >>"$log"
  timeout "$step" build-measure/bench/gpupool_bench_small_tasks --backend cuda --devices 1,2 \
    --lanes 8,16 --modes map,submit --shared-gpu yes 2>&1 | tee -a "$OUT/small_tasks.txt" |
    tee -a "$log"
  step_done "${PIPESTATUS[0]}" "gpupool_bench_small_tasks --shared-gpu yes"
fi

if [ -n "$host_lanes" ]; then
  say "== W4's shape with host lanes beside GPU 0's lanes: $host_lanes"
  for count in 0 ${host_lanes//,/ }; do
    echo "-- C++, $count host lanes" | tee -a "$OUT/host_lanes.txt" >>"$log"
    timeout "$step" build-measure/bench/gpupool_bench_small_tasks --backend cuda --devices 1 \
      --lanes 8,16 --modes map --host-lanes "$count" 2>&1 | tee -a "$OUT/host_lanes.txt" |
      tee -a "$log"
    step_done "${PIPESTATUS[0]}" "gpupool_bench_small_tasks --host-lanes $count"
    [ "$count" = 0 ] && continue
    echo "-- Python, $count host lanes" | tee -a "$OUT/host_lanes.txt" >>"$log"
    CUDA_VISIBLE_DEVICES=0 timeout "$step" python3 bench/python_task_cost.py --repeat 5 \
      --only "gpupool square map|gpupool square submit loop, default lanes" \
      --host-lanes "$count" 2>&1 | tee -a "$OUT/host_lanes.txt" | tee -a "$log"
    step_done "${PIPESTATUS[0]}" "bench/python_task_cost.py --host-lanes $count"
  done
fi

if [ $shared = 1 ]; then
  say "== GPU 0 as two devices against one, W2 and W4 (bench/shared_devices.py)"
  timeout "$step" python3 bench/shared_devices.py --json "$OUT/shared_devices.json" 2>&1 |
    tee "$OUT/shared_devices.txt" | tee -a "$log"
  step_done "${PIPESTATUS[0]}" "bench/shared_devices.py"
fi

if [ $priority = 1 ]; then
  # The defaults, then the bytes the lanes keep queued cut two ways (smaller chunks, fewer
  # lanes): an urgent task's upload waits behind them in the copy engine's queue.
  : >"$OUT/priority.txt"
  for shape in "" "--lanes 16 --slots 2 --chunk-bytes 1048576" \
    "--lanes 4 --slots 2 --chunk-bytes 4194304"; do
    say "== A tiny urgent task behind a W2 map (bench/priority_latency.py ${shape:-(defaults)})"
    # shellcheck disable=SC2086  # the shape is a list of arguments
    timeout "$step" python3 bench/priority_latency.py --backend cuda $shape 2>&1 |
      tee -a "$OUT/priority.txt" | tee -a "$log"
    step_done "${PIPESTATUS[0]}" "bench/priority_latency.py $shape"
  done
fi

# dask_step WHAT ARGS...: one run of bench/dask_gpus.py, its JSON into dask.txt.
dask_step() {
  local what=$1
  shift
  say "== Dask: $what (bench/dask_gpus.py $*)"
  timeout "$step" python3 bench/dask_gpus.py --repeat 3 "$@" 2>&1 | tee -a "$OUT/dask.txt" |
    tee -a "$log"
  step_done "${PIPESTATUS[0]}" "bench/dask_gpus.py $*"
}

if [ $dask = 1 ] || [ $dask_model = 1 ]; then
  # Where they do not import, the wheels scripts/stage-wheels put in .deps/wheels (a machine
  # without package access), installed into this run's own folder beside the package's.
  if ! install_staged_wheels "$pydir/dask" "$OUT/pip-dask.log" "$log"; then
    say "FAIL: --dask or --dask-model, but dask and distributed do not import (pip install '.[dask]', or scripts/stage-wheels where PyPI can be reached; an install from .deps/wheels logs to pip-dask.log)"
    status=1
    dask=0 dask_model=0
  fi
fi
if [ $dask = 1 ]; then
  if [ "$gpus" -ge 2 ]; then
    dask_step "one worker per GPU against one executor per GPU" --gpus "$gpus"
  else
    say "(bench/dask_gpus.py over every GPU left out: it needs two or more GPUs)"
  fi
  # shellcheck disable=SC2054  # "100,1000" is one argument, a list
  w4=(--blocks 20000 --elements 1000 --blocks-per-task 100,1000 --executor-chunksize 1000)
  dask_step "one worker against one process, GPU 0, W2 size (and traced)" --gpus 1 --one-gpu \
    --trace
  dask_step "one worker against one process, GPU 0, W4 size" --gpus 1 --one-gpu "${w4[@]}"
  dask_step "two workers sharing GPU 0 against two processes, W2 size (and traced)" --gpus 2 \
    --one-gpu --trace
  dask_step "two workers sharing GPU 0 against two processes, W4 size" --gpus 2 --one-gpu \
    "${w4[@]}"
fi
if [ $dask_model = 1 ]; then
  say "== Dask's per-task cost with tiny blocks, CPU backend (bench/dask_scaling.py)"
  GPUPOOL_BACKEND=cpu timeout "$step" python3 bench/dask_scaling.py --workers 1,2,4,8 \
    --blocks 4000 2>&1 | tee -a "$OUT/dask.txt" | tee -a "$log"
  step_done "${PIPESTATUS[0]}" "bench/dask_scaling.py"
  say "== The cluster model against a simulated cluster (bench/dask_cluster_model.py)"
  GPUPOOL_BACKEND=cpu timeout "$((step * 12))" python3 bench/dask_cluster_model.py \
    --workers 1,2,4,8,16,32,64 --pools-at-once --json "$OUT/dask_cluster_model.json" 2>&1 |
    tee -a "$OUT/dask.txt" | tee -a "$log"
  step_done "${PIPESTATUS[0]}" "bench/dask_cluster_model.py"
fi

# The signal that switches the profiler on and off (SIGUSR2): the benchmarks send it to
# themselves around their timed rounds (--profile-signal), so that imports, the inputs' making
# and warm-up rounds stay out of the profiles.
profile_signal=12

# profiled NAME COMMAND...: COMMAND under gperftools' CPU profiler (.deps/profiler), switched
# on and off by $profile_signal. gperftools numbers the file of each span it sampled (one per
# variant the benchmark times, in the order it prints them): the first becomes $OUT/NAME.prof,
# the others stay NAME.prof.1, .2, ... (bench/read_profile.py --also adds them). Files of other
# processes (named after their pids) are dropped.
profiled() {
  local name=$1 rc
  shift
  LD_LIBRARY_PATH=$PWD/.deps/profiler LD_PRELOAD=$PWD/.deps/profiler/libprofiler.so.0 \
    CPUPROFILE="$OUT/$name.prof" CPUPROFILESIGNAL=$profile_signal CPUPROFILE_FREQUENCY=1000 \
    timeout "$step" "$@"
  rc=$?
  [ -f "$OUT/$name.prof.0" ] && mv "$OUT/$name.prof.0" "$OUT/$name.prof"
  find "$OUT" -maxdepth 1 -name "$name.prof_*" -delete
  return $rc
}

if [ $profile = 1 ]; then
  if [ -f .deps/profiler/libprofiler.so.0 ]; then
    # Each raw profile comes back with the files to read it by where the sources are
    # (bench/read_profile.py): the program, and this machine's libraries, which differ from
    # another machine's copies of them.
    # As `gpupool compare` times it: each round frees the last round's results on the clock.
    say "== CPU profile of W4's shape from C++ (map, 8 lanes, 40 rounds, results kept) -> w4.prof"
    bench=build-measure/bench/gpupool_bench_small_tasks
    profiled w4 "$bench" --backend cuda --devices 1 --lanes 8 --modes map --repeat 40 \
      --keep-results yes --profile-signal $profile_signal 2>&1 |
      tee -a "$OUT/profile.txt" | tee -a "$log"
    step_done "${PIPESTATUS[0]}" "the profile of W4"
    if [ -f "$OUT/w4.prof" ]; then
      cp "$bench" "$OUT/w4.bin"
      cp "$(ldd "$bench" | awk '/libc.so.6/ {print $3}')" "$OUT/libc.so.6"
    fi
    say "== CPU profile of a Python submit loop (bench/python_task_cost.py) -> submit.prof"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} profiled submit python3 \
      bench/python_task_cost.py --repeat 10 --only "gpupool square submit loop, default lanes" \
      --profile-signal $profile_signal 2>&1 | tee -a "$OUT/profile.txt" | tee -a "$log"
    step_done "${PIPESTATUS[0]}" "the profile of bench/python_task_cost.py"
    say "== CPU profile of a Python map of the square (bench/python_task_cost.py) -> map.prof"
    CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} profiled map python3 \
      bench/python_task_cost.py --repeat 20 --only "gpupool square map, default lanes" \
      --profile-signal $profile_signal 2>&1 | tee -a "$OUT/profile.txt" | tee -a "$log"
    step_done "${PIPESTATUS[0]}" "the profile of the Python map"
    if [ -f "$OUT/submit.prof" ] || [ -f "$OUT/map.prof" ]; then
      py=$(python3 -c 'import os, sys; print(os.path.realpath(sys.executable))')
      ext=$(python3 -c 'import gpupool._ext as e; print(e.__file__)')
      cp "$py" "$OUT/python.bin"
      cp "$ext" "$OUT/"
      ldd "$py" "$ext" | awk '/libpython|libc.so.6/ {print $3}' | sort -u |
        while read -r lib; do cp "$lib" "$OUT/"; done
    fi
  else
    say "FAIL: --profile, but no .deps/profiler/ (run scripts/stage-profiler first)"
    status=1
  fi
fi
say "gpu measure: exit $status (results in $OUT)"
exit $status
