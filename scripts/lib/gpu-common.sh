# shellcheck shell=bash
# Shared by the commands of scripts/gpu (sourced from the repository root, after each command
# has read its options): the output folder, the build settings and small helpers.

# usage_error MESSAGE: the message and the command's usage on stderr, exit status 2.
usage_error() {
  echo "scripts/gpu: $1" >&2
  usage >&2
  exit 2
}

# need_value OPTION COUNT: OPTION takes a value; COUNT is how many arguments are left with it.
need_value() {
  [ "$2" -ge 2 ] || usage_error "$1 needs a value"
}

# need_count OPTION VALUE: VALUE must be a whole number of at least 1.
need_count() {
  if ! [[ $2 =~ ^[0-9]{1,9}$ ]] || [ "$2" -lt 1 ]; then
    usage_error "$1 must be a whole number of at least 1, not '$2'"
  fi
}

# start_run: makes $OUT (default ./gpu-out) and sets the build up: CUDA architectures (default
# 90), the toolkit and configure/build (scripts/common.sh).
start_run() {
  OUT=${OUT:-$PWD/gpu-out}
  mkdir -p "$OUT" || exit 1
  OUT=$(cd "$OUT" && pwd) || exit 1
  export OUT
  export GPUPOOL_CUDA_ARCHITECTURES=${GPUPOOL_CUDA_ARCHITECTURES:-90}
  # shellcheck source=scripts/common.sh
  source scripts/common.sh
}

# gpu_count: how many GPUs nvidia-smi lists (0 without it).
gpu_count() {
  nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l
}

# install_python DIR LOG [PIP_ARGS...]: pip installs this tree's package into DIR (its build log
# in LOG; its end printed when it fails).
install_python() {
  local dir=$1 log=$2
  shift 2
  python3 -m pip install --no-build-isolation --no-deps --target "$dir" "$@" . >"$log" 2>&1 || {
    tail -40 "$log"
    return 1
  }
}

# await_builds PID LOG [PID LOG...]: waits for each build started in the background (`&`, its
# process PID, its output in LOG); non-zero if any failed, after the end of each failed one's LOG.
await_builds() {
  local failed=0
  while [ $# -ge 2 ]; do
    if ! wait "$1"; then
      failed=1
      echo "FAIL: the build logging to $2"
      tail -40 "$2"
    fi
    shift 2
  done
  return $failed
}

# install_staged_wheels DIR LOG [NOTE]: where dask and distributed do not import, installs the
# wheels scripts/stage-wheels put in .deps/wheels (a machine without package access) into DIR and
# puts DIR on PYTHONPATH (pip's output in LOG; what it did also appended to the file NOTE).
# Those of distributions this Python lacks or has in another version, and dask and distributed
# always (they pin each other): DIR comes before site-packages, and a staged copy of a package
# the machine has in the same version would only shadow it. Returns 0 where dask and
# distributed import afterwards.
install_staged_wheels() {
  local dir=$1 log=$2 note=${3:-/dev/null} wheel file name version wanted=()
  if ! python3 -c 'import dask, distributed' >/dev/null 2>&1 &&
    compgen -G ".deps/wheels/*.whl" >/dev/null; then
    for wheel in .deps/wheels/*.whl; do
      file=${wheel##*/}
      name=${file%%-*}
      version=${file#*-}
      version=${version%%-*}
      if [ "$name" = dask ] || [ "$name" = distributed ] ||
        ! python3 -c 'import importlib.metadata as m, sys
sys.exit(m.version(sys.argv[1]) != sys.argv[2])' "$name" "$version" >/dev/null 2>&1; then
        wanted+=("$wheel")
      fi
    done
    echo "-- dask and distributed from .deps/wheels: ${#wanted[@]} of them installed" |
      tee -a "$note"
    if python3 -m pip install --no-index --no-deps --target "$dir" "${wanted[@]}" >"$log" 2>&1; then
      export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$dir
    fi
  fi
  python3 -c 'import dask, distributed' >/dev/null 2>&1
}

# tree_commit: the commit this tree is at, "+modified" where tracked files differ from it (as
# `gpupool compare` records it), or "unknown" outside a git checkout.
tree_commit() {
  local commit
  commit=$(git rev-parse HEAD 2>/dev/null) || { echo unknown; return; }
  if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    commit+="+modified"
  fi
  echo "$commit"
}

# seconds_since START: seconds since START (date +%s.%N), two decimals.
seconds_since() {
  python3 -c 'import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))' \
    "$1" "$(date +%s.%N)"
}

# pack_out KEEP...: every file in $OUT but those named (paths within $OUT) goes into one
# archive, $OUT/logs.tar.gz, and is removed, so that a run's results are a handful of files
# wherever they are copied from.
# `tar -xzf logs.tar.gz` gives the logs back where they were.
pack_out() {
  local rest=() f kept
  while IFS= read -r -d '' f; do
    f=${f#"$OUT"/}
    [ "$f" = logs.tar.gz ] && continue
    kept=0
    for k in "$@"; do [ "$f" = "$k" ] && kept=1; done
    [ $kept = 1 ] || rest+=("$f")
  done < <(find "$OUT" -type f -print0)
  [ ${#rest[@]} -eq 0 ] && return 0
  tar -czf "$OUT/logs.tar.gz" -C "$OUT" -- "${rest[@]}" &&
    (cd "$OUT" && rm -f -- "${rest[@]}") &&
    find "$OUT" -mindepth 1 -type d -empty -delete
}

