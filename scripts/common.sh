# Shared by the build scripts: where the CUDA toolkit is and how to configure a build.
# Sourced, not run.

# nvcc is often installed but not on PATH.
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
: "${GPUPOOL_CUDA_ARCHITECTURES:=90}"
jobs=$(nproc 2>/dev/null || echo 2)

# configure BUILD_DIR [extra cmake args...]
configure() {
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES="$GPUPOOL_CUDA_ARCHITECTURES" "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
}

# build BUILD_DIR [targets...]: builds quietly, showing the log only when the build fails.
build() {
  local dir=$1
  shift
  local targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build "$dir" -j "$jobs" "${targets[@]}" >"$dir.build.log" 2>&1 ||
    { tail -60 "$dir.build.log"; return 1; }
}
