# shellcheck shell=bash
# scripts/gpu check: every test on a GPU machine, and the commands a user runs first. Run through
# scripts/gpu, from the repository root.
set -uo pipefail
source scripts/lib/gpu-common.sh

usage() {
  cat <<'EOF'
usage: scripts/gpu check [--out DIR] [--quick] [--no-sanitizer] [--soak-tasks N]
                         [--w5-repeat N] [-- PYTEST_ARGS...]

Builds for sm_90 in build-gpu (tests, tools and benchmarks; NVTX ranges on) and runs:
  1. the GoogleTest suite as one process, and on a machine with several GPUs again on
     the first GPU alone; ctest's CUDA, tool, example, benchmark and install tests.
     Any skipped test fails the check, but for the three that cannot run with (some) GPUs.
  2. compute-sanitizer: an out-of-bounds write in a raw kernel must be caught; the
     kernel and CUDA trace tests must be clean under memcheck, racecheck and synccheck
  3. W5 from C++ (gpupool_bench_w5: one launch, map_on_device, a task per chunk)
  4. `gpupool info --tuning remeasure` (the sweep the default settings come from)
     and `gpupool demo`
  5. pip install of the package, pytest (only skips that do not depend on a GPU
     allowed; Dask's tests too, from .deps/wheels where dask does not import:
     scripts/stage-wheels), examples/seed.py

options:
  --out DIR         where the results go (default ./gpu-out; env OUT)
  --quick           the C++ suite once, compute-sanitizer's memcheck only, W5 with
                    3 runs (env QUICK=1)
  --no-sanitizer    leave compute-sanitizer out (env SANITIZER=0)
  --soak-tasks N    also the soak test (tests/test_soak.cpp): N tasks from 8
                    threads on CUDA, injected faults, random cancels (env SOAK_TASKS)
  --w5-repeat N     timed runs of W5 from C++ (default 10; env W5_REPEAT)
  -- PYTEST_ARGS    what pytest runs instead of python/tests (env PYTEST_ARGS,
                    split on spaces)
  -h, --help        this text

writes to $OUT:
  summary.txt       everything printed: the commit checked, the GPUs, the test
                    counts and failures, compute-sanitizer's verdicts, W5, the
                    tuning sweep, the demo, package versions, the seed example
  logs.tar.gz       the rest, packed in one file (tar -xzf it): build.log,
                    gtest.log, gtest.xml, gtest-1gpu.log, soak.log, ctest.log,
                    oob.log, memcheck.log, racecheck.log, synccheck.log, pip.log,
                    pytest.log
EOF
}

quick=${QUICK:-0}
sanitizer_on=${SANITIZER:-1}
soak_tasks=${SOAK_TASKS:-}
w5_repeat=${W5_REPEAT:-}
pytest_args=()
if [ -n "${PYTEST_ARGS:-}" ]; then read -ra pytest_args <<<"$PYTEST_ARGS"; fi
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --out) need_value "$1" $#; OUT=$2; shift ;;
    --quick) quick=1 ;;
    --no-sanitizer) sanitizer_on=0 ;;
    --soak-tasks) need_value "$1" $#; soak_tasks=$2; shift ;;
    --w5-repeat) need_value "$1" $#; w5_repeat=$2; shift ;;
    --) shift; pytest_args=("$@"); break ;;
    *) usage_error "check: unknown option '$1'" ;;
  esac
  shift
done
[ -z "$soak_tasks" ] || need_count --soak-tasks "$soak_tasks"
if [ -z "$w5_repeat" ]; then
  w5_repeat=10
  [ "$quick" = 1 ] && w5_repeat=3
fi
need_count --w5-repeat "$w5_repeat"
[ ${#pytest_args[@]} -gt 0 ] || pytest_args=(python/tests)

start_run
status=0
# Everything printed (each step's counts, verdicts and figures; the logs hold the rest) is the
# summary.
exec > >(tee "$OUT/summary.txt") 2>&1
summary_pid=$!
pydir=""
# At exit: the package's folder removed, the summary written out before the exit status, and
# every other file of $OUT packed into logs.tar.gz (pack_out).
trap '[ -z "$pydir" ] || rm -rf "$pydir"; exec >&- 2>&-; wait "$summary_pid"; pack_out summary.txt' EXIT

echo "commit: $(tree_commit)"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
  --format=csv 2>&1
gpus=$(gpu_count)

echo "== build (sm_$GPUPOOL_CUDA_ARCHITECTURES)"
# Tests, tools and NVTX ranges on, whatever an earlier configure of build-gpu cached.
configure build-gpu -DGPUPOOL_WITH_CUDA=ON -DGPUPOOL_WITH_NVTX=ON -DGPUPOOL_BUILD_TESTS=ON \
  -DGPUPOOL_BUILD_TOOLS=ON || exit 1
cmake --build build-gpu -j "$jobs" >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }

echo "== tests"
# Starting CUDA costs seconds per process (more when many start at once), so the GoogleTest suite
# runs as one process rather than one ctest process per test; ctest runs the rest (the tool, the
# examples, the benchmarks, the install). The suite's copies on two stand-in CPU devices are
# CPU-backend tests, left out here.
# Fixed lanes and chunk sizes where a test leaves them to the executor (as ctest sets it: a test
# counting pieces must not depend on a measurement); the tuning tests clear it. The demo below
# runs with the defaults a user gets.
export GPUPOOL_TUNING=fixed
# run_suite LOG [ARGS...]: the GoogleTest suite (with ARGS) into LOG. Printed: its counts (run,
# passed, skipped) and each failed test's line; where it exits non-zero (a crash prints no failed
# test), the end of its log.
run_suite() {
  local log=$1
  shift
  build-gpu/tests/gpupool_tests --gtest_brief=1 "$@" >"$log" 2>&1 || { status=1; tail -20 "$log"; }
  grep -E "^\[(==========|  PASSED  |  SKIPPED )\] [0-9]+ tests?|^\[  FAILED  \]" "$log"
}
# The XML names every skipped test; the console output only counts them.
gtest_xml="$OUT/gtest.xml"
rm -f "$gtest_xml"
run_suite "$OUT/gtest.log" --gtest_output="xml:$gtest_xml"
if [ "$gpus" -ge 2 ] && [ "$quick" != 1 ]; then
  echo "-- the C++ suite again on one GPU of $gpus (CUDA_VISIBLE_DEVICES=0)"
  CUDA_VISIBLE_DEVICES=0 run_suite "$OUT/gtest-1gpu.log"
fi
if [ -n "$soak_tasks" ]; then
  echo "-- soak: $soak_tasks tasks from 8 threads on CUDA, 1% injected faults, random cancels"
  GPUPOOL_SOAK_TASKS=$soak_tasks GPUPOOL_SOAK_THREADS=8 GPUPOOL_SOAK_BACKEND=cuda \
    build-gpu/tests/gpupool_tests --gtest_filter='Soak.*' >"$OUT/soak.log" 2>&1 || status=1
  grep -E "^soak:|OK|FAILED" "$OUT/soak.log"
fi
# Only the test of refusing CUDA without a GPU, the CPU-backend instance of the raw-kernel test
# (raw kernels are CUDA source), and the refusal of a stream priority beyond GPU 0's range (a GPU
# with every level gpupool asks for, as Hopper has, has no such priority) may skip here.
skipped=$(python3 - "$gtest_xml" <<'EOF'
import sys
import xml.etree.ElementTree as ET

allowed = {"BackendSelection.CudaRequestedWithoutAGpuIsAClearError",
           "Backends/ElementwiseTest.RawKernelsOfOneSourceKeepTheirOwnLaunchShapes/cpu",
           "CudaStreamPriority.APriorityBeyondTheDevicesRangeIsRefused"}
try:
    cases = list(ET.parse(sys.argv[1]).iter("testcase"))
except (OSError, ET.ParseError) as e:
    print(f"no readable XML from the suite: {e}")
    sys.exit(3)
for case in cases:
    name = f"{case.get('classname')}.{case.get('name')}"
    if case.get("result") == "skipped" and name not in allowed:
        print(name)
EOF
)
skip_check=$?
if [ $skip_check -ne 0 ]; then
  echo "FAIL: the suite's skipped tests could not be read: ${skipped:-python3 exited $skip_check}"
  status=1
elif [ -n "$skipped" ]; then
  echo "FAIL: tests skipped on a GPU machine:"
  echo "$skipped"
  status=1
fi
ctest --test-dir build-gpu --output-on-failure -j 8 -R '^(cli|cuda|examples|bench|install)' \
  >"$OUT/ctest.log" 2>&1 || status=1
tail -3 "$OUT/ctest.log"
if grep "(Skipped)" "$OUT/ctest.log"; then
  echo "FAIL: tests skipped on a GPU machine"
  status=1
fi

echo "== compute-sanitizer: an out-of-bounds write is caught; the kernel and CUDA trace tests are clean"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "$sanitizer_on" = 0 ]; then
  echo "(left out: --no-sanitizer)"
elif [ -x "$sanitizer" ]; then
  "$sanitizer" --tool memcheck --error-exitcode 3 build-gpu/tests/gpupool_oob_write >"$OUT/oob.log" 2>&1
  rc=$?
  if [ $rc -eq 3 ] && grep -q "Invalid __global__ write" "$OUT/oob.log"; then
    echo "caught (exit $rc): $(grep -m1 'Invalid __global__ write' "$OUT/oob.log")"
  else
    echo "FAIL: the out-of-bounds write was not caught (exit $rc)"
    tail -20 "$OUT/oob.log"
    status=1
  fi
  # Not the journey test: under memcheck a launch takes long enough that lining the GPU clock up
  # with the host's is off by more than its 50 us of slack (ctest above runs it unhindered).
  # The express slot's tests too: their kernels read and write pinned host memory in place.
  memchecked='Backends/ElementwiseTest.*/cuda:Backends/TraceTest.*/cuda:CudaTrace.*'
  memchecked+=':Backends/ExpressTest.*/cuda'
  memchecked+='-Backends/TraceTest.EveryPieceHasAConsistentJourney/cuda'
  "$sanitizer" --tool memcheck --error-exitcode 3 build-gpu/tests/gpupool_tests \
    --gtest_filter="$memchecked" >"$OUT/memcheck.log" 2>&1 || status=1
  grep -E "PASSED|FAILED|ERROR SUMMARY" "$OUT/memcheck.log" | tail -4
  # Shared-memory races and misused barriers in the built-in, compiled and batch kernels. (Not
  # the kernel-stage length test either: under racecheck a kernel runs far longer than the
  # stamped stage it checks against the host clock.)
  if [ "$quick" != 1 ]; then
    for tool in racecheck synccheck; do
      echo "-- compute-sanitizer --tool $tool"
      "$sanitizer" --tool "$tool" --error-exitcode 3 build-gpu/tests/gpupool_tests \
        --gtest_filter="$memchecked:CudaTrace.TheKernelStageLastsAsLongAsTheKernel" \
        >"$OUT/$tool.log" 2>&1 || status=1
      grep -E "PASSED|FAILED|ERROR SUMMARY" "$OUT/$tool.log" | tail -4
    done
  fi
else
  echo "FAIL: compute-sanitizer not found"
  status=1
fi

echo "== W5: a compiled kernel over 2000 chunks on the GPU (C++)"
build-gpu/bench/gpupool_bench_w5 --repeat "$w5_repeat" || status=1

unset GPUPOOL_TUNING
echo "== the tuning sweep and the demo"
# Measures lanes and chunk size afresh (the sweep the default settings come from) and prints it.
start=$(date +%s.%N)
build-gpu/tools/gpupool info --tuning remeasure || status=1
echo "gpupool info --tuning remeasure took $(seconds_since "$start") s"
build-gpu/tools/gpupool demo || status=1

echo "== Python: pip install, pytest (GPU tests included), the seed example"
python3 -m pip list 2>/dev/null | grep -iE "^(nanobind|scikit.build.core|numpy|cupy|torch) "
pydir=$(mktemp -d /tmp/gpupool-python.XXXXXX) || exit 1
if install_python "$pydir" "$OUT/pip.log"; then
  export PYTHONPATH=$pydir${PYTHONPATH:+:$PYTHONPATH}
  # Dask's tests run here too where .deps/wheels has them (scripts/stage-wheels).
  no_dask="|is not installed \(pip install '\.\[dask\]'\)"
  install_staged_wheels "$pydir/dask" "$OUT/pip-dask.log" && no_dask=""
  GPUPOOL_TUNING=fixed python3 -m pytest -q -rs "${pytest_args[@]}" 2>&1 |
    tee "$OUT/pytest.log" | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  # Skips that do not depend on a GPU may stay: the console script (a --target install makes
  # none), mypy and CPython's test suite where they are not installed, dask where neither it nor
  # .deps/wheels is there, and the CPU-backend notice (never shown with a GPU). With one GPU,
  # the tests that need two skip too.
  two_gpus=""
  [ "$gpus" -lt 2 ] && two_gpus="|needs two GPUs"
  if grep -E "^SKIPPED" "$OUT/pytest.log" |
    grep -vE "BackendUnavailable|not a pip install|import 'mypy'|no CPU-backend notice|test_concurrent_futures is not in$no_dask$two_gpus"; then
    echo "FAIL: Python tests skipped on a GPU machine"
    status=1
  fi
  python3 examples/seed.py || status=1
else
  status=1
fi
echo "gpu check: exit $status (results in $OUT)"
exit $status
