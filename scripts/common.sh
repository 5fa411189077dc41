# Shared by the build scripts: where the CUDA toolkit is and how to configure a build.
# Sourced, not run.

# nvcc is often installed but not on PATH.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
# GPUPOOL_CUDA_ARCHITECTURES (e.g. 90 for a quick build for Hopper alone) reaches CMake from the
# environment, as it does for `pip install .`; unset, the default list is built.
jobs=$(nproc 2>/dev/null || echo 2)

# configure BUILD_DIR [extra cmake args...]
configure() {
  local dir=$1
  shift
  echo "-- configuring $dir" >&2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
}

# build BUILD_DIR [targets...]: shows one line per build step ("[12/42] Building ...", ninja's
# progress) and keeps the whole log, shown in its last lines when the build fails.
build() {
  local dir=$1
  shift
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  echo "-- building $dir${*:+ ($*)}; full log: $dir.build.log" >&2
  local status=0
  cmake --build "$dir" -j "$jobs" "${targets[@]}" 2>&1 | tee "$dir.build.log" |
    grep --line-buffered -E '^\[[0-9]+/[0-9]+\]' >&2 || status=${PIPESTATUS[0]}
  if [ "$status" -ne 0 ]; then
    tail -60 "$dir.build.log"
    return 1
  fi
}
