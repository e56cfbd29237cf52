#!/usr/bin/env bash
# One GPU check, sized to finish in under 8 minutes on a machine with an
# NVIDIA GPU: build the CUDA module, run its tests, run the step / unscale /
# compile / operator workloads at a reduced size, and write the results
# beside the CPU ones:
#
#   bench/RESULTS-gpu.md, bench/results-gpu.json, bench/results-gpu.png
#   bench/gpu/            (run_all.py's own output folder for this run)
#   bench/gpu/log.txt     (every command and its output)
#
# Usage (from anywhere; the environment must already hold jax with CUDA,
# the package's build requirements and the [test,bench] extras: the script
# installs nothing from the network):
#
#   bash bench/gpu_check.sh              # on the GPU machine
#   bash bench/gpu_check.sh --dry-run    # on a CPU machine: the same steps at
#                                        # --tiny size, no CUDA build, results
#                                        # in bench/gpu-dry/ (checks the plumbing)
#
# Environment: PYTHON (default python3), NVCC (default: nvcc on PATH, else
# /usr/local/cuda/bin/nvcc), JAS_GPU_BUDGET_S (default 470: stages are cut
# to fit it).  Exit status: 0 when everything ran; 1 when a stage failed
# (the others still run, and the log says which).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
BUDGET_S="${JAS_GPU_BUDGET_S:-470}"
START=$(date +%s)

if [[ $DRY == 1 ]]; then
  OUT="bench/gpu-dry"
else
  OUT="bench/gpu"
fi
mkdir -p "$OUT"
LOG="$OUT/log.txt"
: > "$LOG"
FAILED=()

say() { echo "== $*" | tee -a "$LOG"; }

# stage NAME SECONDS CMD...: runs CMD under a timeout clipped to what is left
# of the budget; records a failure instead of stopping.
stage() {
  local name="$1" want="$2"
  shift 2
  local left=$((BUDGET_S - ($(date +%s) - START)))
  local t=$((want < left ? want : left))
  if ((t < 10)); then
    say "$name: skipped, budget spent (${BUDGET_S}s)"
    FAILED+=("$name (no time left)")
    return
  fi
  say "$name (timeout ${t}s): $*"
  local s0=$(date +%s)
  timeout --signal=INT --kill-after=10 "$t" "$@" >>"$LOG" 2>&1
  local rc=$?
  say "$name: exit $rc after $(($(date +%s) - s0))s"
  if ((rc != 0)); then FAILED+=("$name (exit $rc)"); fi
}

# --- the machine ------------------------------------------------------------
say "gpu_check $(date -u +%FT%TZ) at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
if [[ $DRY == 0 ]]; then
  if ! command -v nvidia-smi >/dev/null; then
    say "no nvidia-smi: not a GPU machine (use --dry-run on CPU)"
    exit 1
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
  NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
  if [[ ! -x "$NVCC" ]]; then
    say "no nvcc (set NVCC=/path/to/nvcc): the CUDA handler cannot be built"
    exit 1
  fi
  "$NVCC" --version | tail -1 | tee -a "$LOG"
  export CUDACXX="$NVCC"
  export PATH="$(dirname "$NVCC"):$PATH"
  # The tests' conftest defaults JAX_PLATFORMS to cpu; the GPU must win here.
  export JAX_PLATFORMS="cuda,cpu"
else
  export JAX_PLATFORMS="cpu"
fi
"$PYTHON" -c "import jax; print('jax', jax.__version__, jax.devices())" 2>&1 | tee -a "$LOG"

# --- build: the CUDA module (CMake finds nvcc through CUDACXX) --------------
if [[ $DRY == 0 ]]; then
  # --no-build-isolation: the build requirements come from this environment
  # (the GPU machine has no network).  -v keeps CMake's "CUDA handler:" line.
  stage build 150 "$PYTHON" -m pip install --no-deps --no-build-isolation -v -e .
  grep -h "CUDA handler:" "$LOG" | tail -1
  stage import-cuda-module 30 "$PYTHON" -c \
    "import jax_amp_scale._native_cuda as m; print('registrations', m.registrations())"
else
  say "build: skipped (--dry-run)"
fi

# --- tests ------------------------------------------------------------------
stage cuda-tests 90 "$PYTHON" -m pytest -x -q -p no:cacheprovider tests/test_cuda_handler.py

# --- workloads: one run_all.py run, sizes cut to fit ------------------------
# step: 10 repetitions; unscale: 1/100/1,000 leaves of 64 MiB (float32 and
# float16, ours/copy/dispatch floor only: torch and the host bandwidth limit
# are CPU references); compile: the tree model at 10/100/1,000 leaves,
# plain/ours, projected compiles past 25 s skipped (the dense model,
# --models dense, would double the stage); operator: 20,000 scan steps.
if [[ $DRY == 1 ]]; then
  SIZE=(--tiny)
  UNSCALE="unscale=--no-peers --no-torch"
  COMPILE="compile=--models tree --candidates 'ours loss_scaled[auto]'"
  STEP="step="
  OPER="update_scale="
else
  SIZE=()
  UNSCALE="unscale=--no-peers --no-torch --mib 64 --leaves 1 100 1000 --reps 5 --budget-s 30"
  COMPILE="compile=--models tree --leaves 10 100 1000 --reps 3 --budget-s 25 --candidates 'ours loss_scaled[auto]' 'ours loss_scaled[reference]'"
  STEP="step=--reps 10"
  OPER="update_scale=--steps 20000 --reps 5"
fi
stage workloads 330 "$PYTHON" bench/run_all.py "${SIZE[@]}" --out "$OUT" \
  --only step unscale compile update_scale \
  --args "$STEP" --args "$UNSCALE" --args "$COMPILE" --args "$OPER"

# --- results beside the CPU ones ---------------------------------------------
if [[ -f "$OUT/RESULTS.md" ]]; then
  SUFFIX=$([[ $DRY == 1 ]] && echo "gpu-dry" || echo "gpu")
  if [[ $DRY == 0 ]]; then
    cp "$OUT/RESULTS.md" "bench/RESULTS-$SUFFIX.md"
    cp "$OUT/results.json" "bench/results-$SUFFIX.json"
    [[ -f "$OUT/results.png" ]] && cp "$OUT/results.png" "bench/results-$SUFFIX.png"
    say "wrote bench/RESULTS-$SUFFIX.md, bench/results-$SUFFIX.json"
  else
    say "dry run: results in $OUT/ (not copied beside the CPU ones)"
  fi
fi

say "total $(($(date +%s) - START))s of ${BUDGET_S}s budget"
if ((${#FAILED[@]})); then
  say "FAILED: ${FAILED[*]}"
  exit 1
fi
say "all stages ran"
