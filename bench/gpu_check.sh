#!/usr/bin/env bash
# The GPU check, under 8 minutes on an NVIDIA machine: the CUDA build and
# tests, bits against torch's CUDA kernels, the gradient pass, the step and
# the transformer example beside torch; writes bench/RESULTS-gpu.md and
# results/gpu/bench.json (logs in bench/gpu/, copied to $OUT).
#
#   bash bench/gpu_wheels.sh            # first, where there is a network
#   bash bench/gpu_check.sh [--dry-run] # --dry-run: tiny, on a CPU, in bench/gpu-dry/
#
# Environment: PYTHON, NVCC, JAS_CUDA_ARCH (90), JAS_GPU_BUDGET_S (470).
# Exit 1 if any stage failed (the others still run).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
BUDGET_S="${JAS_GPU_BUDGET_S:-470}"
START=$(date +%s)
RUN=$([[ $DRY == 1 ]] && echo bench/gpu-dry || echo bench/gpu)
rm -rf "$RUN" && mkdir -p "$RUN"
LOG="$RUN/log.txt"
FAILED=()

say() { echo "== $*" | tee -a "$LOG"; }

# stage NAME SECONDS CMD...: CMD under a timeout clipped to the budget left.
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
  command -v nvidia-smi >/dev/null || { say "no nvidia-smi (on a CPU: --dry-run)"; exit 1; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
  NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
  [[ -x "$NVCC" ]] || { say "no nvcc (set NVCC=/path/to/nvcc) to build the CUDA handler"; exit 1; }
  "$NVCC" --version | tail -1 | tee -a "$LOG"
  export CUDACXX="$NVCC" PATH="$(dirname "$NVCC"):$PATH"
  # The tests' conftest defaults JAX_PLATFORMS to cpu; the GPU must win here.
  export JAX_PLATFORMS="cuda,cpu"
  # JAX and torch share the GPU in one process.
  export XLA_PYTHON_CLIENT_MEM_FRACTION=0.45
else
  export JAX_PLATFORMS="cpu"
fi
# What the image lacks, from the carried wheels (bench/gpu_wheels.sh).
if [[ -d bench/gpu-wheels ]]; then
  stage wheels 60 "$PYTHON" -m pip install -q --no-index --find-links bench/gpu-wheels \
    pytest hypothesis jmp flatbuffers matplotlib
fi
"$PYTHON" -c "import platform, importlib.util as u; print('python', platform.python_version()); \
[print(m, __import__(m).__version__ if u.find_spec(m) else 'MISSING') for m in 'jax jaxlib torch optax flax numpy pytest hypothesis jmp'.split()]; \
import jax; print('jax devices', jax.devices()); import torch; print('torch cuda', torch.version.cuda, torch.cuda.is_available())" 2>&1 | tee -a "$LOG"

# --- build: the CUDA module for this GPU's architecture
if [[ $DRY == 0 ]]; then
  # No network: the build requirements come from this environment.
  stage build 150 "$PYTHON" -m pip install --no-deps --no-build-isolation -v -e . \
    --config-settings=cmake.define.CMAKE_CUDA_ARCHITECTURES="${JAS_CUDA_ARCH:-90}"
  grep -h "CUDA handler:" "$LOG" | tail -1
  stage cuda-handler 30 "$PYTHON" -c "import jax_amp_scale as jas; b = jas.available_backends('cuda'); \
print('cuda backends', b); assert 'ffi' in b, 'no CUDA handler registered'"
else
  say "build: skipped (--dry-run)"
fi

# --- tests: the CUDA handler's ------------------------------------------------
stage cuda-tests 60 "$PYTHON" -m pytest -q -p no:cacheprovider tests/mechanisms/handlers/test_cuda_handler.py

# --- workloads: one run_all.py workload a stage, into one results.json -----
if [[ $DRY == 1 ]]; then
  SIZE=(--tiny)
  EXACT=()
  UNSCALE=(--no-peers --in-process)
  STEP=(--optimizer adam --compute float16 --torch)
  LM=(--steps 4 --layers 1 --eval-windows 8)
else
  SIZE=()
  EXACT=(--states 4096 --random-factors 10)
  UNSCALE=(--no-peers --in-process --leaves 1 100 1000 10000 --reps 7 --budget-s 40)
  STEP=(--optimizer adam --compute float16 --torch --models 4096x8x2048 256x4x64 --reps 25)
  LM=(--steps 200 --check)
fi
workload() {  # workload NAME SECONDS ARGS...: one run_all.py workload
  local w="$1" t="$2" left=$((BUDGET_S - ($(date +%s) - START)))
  shift 2
  t=$((t < left ? t : left))
  stage "$w" "$t" "$PYTHON" bench/run_all.py "${SIZE[@]}" --out "$RUN" --results "$RUN/results.json" --only "$w" \
    --timeout-s $((t - 15)) --args "$w=$*"
}
workload exact 90 "${EXACT[@]}"
workload unscale 170 "${UNSCALE[@]}"
workload step 100 "${STEP[@]}"

# --- the transformer example's four precisions, with step times --------------
stage transformer 90 "$PYTHON" examples/transformer_lm.py "${LM[@]}" --out-dir "$RUN/transformer"

# --- the GPU tier of the core tests (not those asserting XLA:CPU's compiled text)
GPU_TIER=(tests/operators/update_scale/test_golden.py tests/operators/update_scale/test_found_inf.py tests/operators/update_scale/test_differential.py
          tests/operators/unscale_and_check/test_inverse_scale.py tests/operators/update_scale/test_torch_oracle.py tests/mechanisms/floats/test_fast_product.py
          tests/public/test_first_contact.py)
[[ $DRY == 1 ]] && GPU_TIER=(tests/operators/update_scale/test_golden.py)
JAS_EXAMPLES_DIVISOR=3 stage gpu-tier 150 "$PYTHON" -m pytest -q -p no:cacheprovider -rs \
  "${GPU_TIER[@]}"

# --- results beside the CPU ones ---------------------------------------------
if [[ -f "$RUN/RESULTS.md" && -f "$RUN/transformer/transformer_lm.md" ]]; then
  printf '\n#### The transformer example in four precisions\n\n`python examples/transformer_lm.py %s` (seconds: the whole run with compilation; ms/step: after the first tenth of the steps).\n\n' \
    "${LM[*]}" >>"$RUN/RESULTS.md"
  cat "$RUN/transformer/transformer_lm.md" >>"$RUN/RESULTS.md"
fi
if [[ -f "$RUN/RESULTS.md" && $DRY == 0 ]]; then
  mkdir -p results/gpu && cp "$RUN/results.json" results/gpu/bench.json && cp "$RUN/RESULTS.md" bench/RESULTS-gpu.md
  say "wrote bench/RESULTS-gpu.md and results/gpu/bench.json"
elif [[ $DRY == 1 ]]; then
  say "dry run: results in $RUN/ (not copied beside the CPU ones)"
fi
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  cp -r "$RUN" "$OUT/" && cp bench/RESULTS-gpu.md results/gpu/bench.json "$OUT/" 2>/dev/null
  say "copied the results to \$OUT"
fi

say "total $(($(date +%s) - START))s of ${BUDGET_S}s budget"
((${#FAILED[@]})) && { say "FAILED: ${FAILED[*]}"; exit 1; }
say "all stages ran"
