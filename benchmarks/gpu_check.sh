#!/usr/bin/env bash
# The first minutes on a GPU, prepared: run from the repository root on a machine with an NVIDIA GPU, in under 8 minutes.
#
#     bash benchmarks/gpu_check.sh             # every stage below, then a summary
#     bash benchmarks/gpu_check.sh --dry-run   # each stage's command and time limit; installs and runs nothing (any machine)
#
# Stages, each under `timeout` (a hang costs its own limit, never the budget of the rest), all of them together within
# GPU_CHECK_BUDGET seconds (default 470: a stage gets at most what is left, and one with under 10 s left is skipped):
#   env      nvidia-smi (the GPU, its driver and the CUDA version the driver supports), nvcc, python
#   install  pip install of what is missing among the test tools, NVIDIA's nvrtc/runtime/cuobjdump/nvdisasm wheels, torch
#            (a machine without network keeps what it has); uopc itself runs from this checkout (PYTHONPATH to the four
#            packages' src folders: what is tested is the tree here, installed or not)
#   smoke    a few kernels through the driver on device CUDA against NumPy (elementwise, a reduction, an f16 GEMM), with
#            UOPC_CUDA_SYNC=1 so that a fault names its kernel
#   suite    the GPU suite (packages/uopc-tensor/tests_gpu) on the device and the emulator, but the multi-block GEMMs
#   gemms    the multi-block tensor-core GEMMs on the device (1024^3, 256x512x192, 128x2048x64), one line each
#   cublas   the f16 GEMM 8192 beside torch.matmul (cuBLAS) in the same process (benchmarks/gpu.py --sizes 8192)
#   sass     the SASS counts of the f16 GEMM 8192's and the GPT step's kernels for sm_90 (testing/sass.py)
#   bench    benchmarks/gpu.py: f16 and f32 GEMMs at 4096 and 8192 beside cuBLAS and the H200 roofline
#   gpt      benchmarks/gpu.py --gpt: the jitted GPT training step on the device beside PyTorch eager on CUDA
# Everything printed is also written to $OUT/gpu_check.log and the summary to $OUT/gpu_check_summary.txt when OUT is
# set (else under /tmp/uopc-gpu-check). Exit status: 0 when every stage passed, 1 when one failed or timed out, 2 when
# it isn't run from the repository root, 3 when there is no GPU here (outside --dry-run).
# Settings: PYTHON (default python3), GPU_CHECK_BUDGET, GPU_CHECK_WORKERS (pytest processes, default 8),
# GPU_CHECK_NO_INSTALL=1 (skip pip), UOPC_CACHE_DIR (default /tmp/uopc-gpu-check-cache).
set -uo pipefail

DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: bash benchmarks/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac

if [[ ! -f noxfile.py || ! -d packages/uopc-tensor/tests_gpu || ! -f benchmarks/gpu.py ]]; then
  echo "gpu_check.sh: run it from the repository root (no noxfile.py, packages/uopc-tensor/tests_gpu or benchmarks/gpu.py in $PWD)" >&2
  exit 2
fi

PY=${PYTHON:-python3}
BUDGET=${GPU_CHECK_BUDGET:-470}
WORKERS=${GPU_CHECK_WORKERS:-8}
DEST=${OUT:-/tmp/uopc-gpu-check}
mkdir -p "$DEST"
LOG=$DEST/gpu_check.log
SUMMARY=$DEST/gpu_check_summary.txt
: > "$LOG"
export PYTHONUNBUFFERED=1
export UOPC_CACHE_DIR=${UOPC_CACHE_DIR:-/tmp/uopc-gpu-check-cache}
export PYTHONPATH="$PWD/packages/uopc-ir/src:$PWD/packages/uopc-lower/src:$PWD/packages/uopc-backends/src:$PWD/packages/uopc-tensor/src${PYTHONPATH:+:$PYTHONPATH}"

NAMES=()
RESULTS=()
TIMES=()

say() { printf '%s\n' "$*" | tee -a "$LOG"; }

# run_stage NAME LIMIT COMMAND...: COMMAND under timeout, its output shown and logged, its result recorded
run_stage() {
  local name=$1 limit=$2
  shift 2
  local left=$((BUDGET - SECONDS))
  NAMES+=("$name")
  if ((limit > left)); then limit=$left; fi
  # a python or bash script given inline is shown as its line count (in full under --dry-run)
  local shown="" arg
  for arg in "$@"; do
    if [[ $arg == *$'\n'* ]] && ((!DRY_RUN)); then shown+=" <inline script, $(wc -l <<< "$arg") lines>"; else shown+=" $arg"; fi
  done
  say ""
  say "==== $name (limit ${limit} s, ${SECONDS} s elapsed):$shown"
  if ((DRY_RUN)); then RESULTS+=("dry run"); TIMES+=(0); return 0; fi
  if ((limit < 10)); then say "skipped: the budget of ${BUDGET} s is spent"; RESULTS+=("skipped (budget spent)"); TIMES+=(0); return 0; fi
  local start=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  TIMES+=($((SECONDS - start)))
  case $rc in
    0) RESULTS+=("ok") ;;
    124 | 137) RESULTS+=("TIMEOUT after ${limit} s") ;;
    *) RESULTS+=("FAILED (exit status $rc)") ;;
  esac
  return 0
}

summary() {
  {
    echo ""
    echo "==== summary ($(date -u '+%Y-%m-%d %H:%M:%S UTC'), ${SECONDS} s in all; log: $LOG)"
    local i
    for i in "${!NAMES[@]}"; do printf '  %-8s %5s s  %s\n' "${NAMES[$i]}" "${TIMES[$i]}" "${RESULTS[$i]}"; done
  } | tee -a "$LOG" > "$SUMMARY"
  cat "$SUMMARY"
}

# ---- is there a GPU? -----------------------------------------------------------------------------------------------
GPU=""
if command -v nvidia-smi > /dev/null 2>&1; then GPU=$(timeout 20 nvidia-smi -L 2> /dev/null | grep -m1 '^GPU' || true); fi
if [[ -z $GPU ]]; then
  why="nvidia-smi is not installed"
  command -v nvidia-smi > /dev/null 2>&1 && why="nvidia-smi lists no GPU"
  if ((DRY_RUN)); then
    say "gpu_check.sh --dry-run: no NVIDIA GPU here ($why); the stages it would run:"
  else
    say "gpu_check.sh: no NVIDIA GPU here ($why): nothing to check; run it on a machine with one (--dry-run lists the stages)"
    NAMES+=("gpu"); RESULTS+=("none: $why"); TIMES+=(0)
    summary
    exit 3
  fi
else
  say "gpu_check.sh: $GPU"
fi

# ---- the stages ----------------------------------------------------------------------------------------------------
# shellcheck disable=SC2016  # expanded by the inner bash, where $0 is the python to use
ENV_SCRIPT='nvidia-smi
nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total,clocks.max.sm --format=csv
if command -v nvcc > /dev/null; then nvcc --version | tail -2; else echo "nvcc: not on PATH (NVRTC compiles instead)"; fi
"$0" -c "import sys, platform; print(\"python\", sys.version.split()[0], platform.machine())"'
run_stage env 20 bash -c "$ENV_SCRIPT" "$PY"

# what the stages import, by module, and the pip requirement that brings each one
INSTALL_SCRIPT='
import importlib.util, os, subprocess, sys
need = {"numpy": "numpy>=1.24", "pytest": "pytest>=8", "hypothesis": "hypothesis>=6.100", "xdist": "pytest-xdist>=3",
        "safetensors": "safetensors", "torch": "torch", "nvidia": "nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"}
missing = [req for mod, req in need.items() if importlib.util.find_spec(mod) is None]
if missing and os.environ.get("GPU_CHECK_NO_INSTALL"): print("GPU_CHECK_NO_INSTALL: not installing", *missing)
elif missing:
  reqs = " ".join(missing).split()
  print("installing", *reqs)
  # no network (a sealed machine): pip gives up in seconds, and the stages run with what is here
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--retries", "0", "--timeout", "15", *reqs])
else: print("every tool is here already:", ", ".join(need))
import uopc.tensor, uopc.backends.cuda as cuda
print("uopc from", uopc.tensor.__file__.rsplit("/src/", 1)[0], "; NVRTC:", "found" if cuda._nvrtc() is not None else "not found",
      "; cuobjdump:", __import__("sass").cuobjdump() or "not found", "; nvdisasm:", __import__("sass").nvdisasm() or "not found")
still = [mod for mod in need if importlib.util.find_spec(mod) is None]
if "torch" in still: print("torch is missing: benchmarks/gpu.py times uopc alone (no cuBLAS column)")
if still := [mod for mod in still if mod not in ("torch", "nvidia")]: sys.exit(f"still missing: {still}")
'
run_stage install 90 env PYTHONPATH="$PWD/testing:$PYTHONPATH" "$PY" -c "$INSTALL_SCRIPT"

SMOKE_SCRIPT='
import numpy as np
from uopc.backends import cuda
from uopc.tensor import Tensor
d = cuda._driver()
print(f"device {d.arch}, driver supports CUDA {d.version // 1000}.{d.version % 1000 // 10}, compiler {cuda.CUDACompiler().toolkit()}, "
      f"shared memory per block {d.max_shared}")
x = np.random.default_rng(0).standard_normal((64, 300)).astype(np.float32)
got = ((Tensor(x, device="CUDA") * 2 + 1).exp2().sum(1)).numpy()
np.testing.assert_allclose(got, np.exp2(x * 2 + 1).sum(1), rtol=1e-4)
a, b = (np.random.default_rng(s).standard_normal((128, 256)).astype(np.float16) for s in (1, 2))
got = (Tensor(a, device="CUDA").float() @ Tensor(b.T.copy(), device="CUDA").float()).numpy()
np.testing.assert_allclose(got, a.astype(np.float32) @ b.T.astype(np.float32), rtol=1e-3, atol=1e-3)
print("smoke: elementwise, row sums and an f16 tensor-core GEMM on the device agree with NumPy")
'
run_stage smoke 45 env UOPC_CUDA_SYNC=1 "$PY" -c "$SMOKE_SCRIPT"

run_stage suite 150 "$PY" -m pytest packages/uopc-tensor/tests_gpu -q -rs -n "$WORKERS" -p no:cacheprovider -k "not (CUDA and gemm_f16_)"
run_stage gemms 45 "$PY" -m pytest packages/uopc-tensor/tests_gpu/test_gpu_suite.py -v -p no:xdist -p no:cacheprovider -k "CUDA and gemm_f16_"
run_stage cublas 45 "$PY" benchmarks/gpu.py --sizes 8192 --dtypes f16
run_stage sass 30 "$PY" testing/sass.py
run_stage bench 60 "$PY" benchmarks/gpu.py --sizes 4096,8192
run_stage gpt 120 "$PY" benchmarks/gpu.py --gpt default,nanogpt

summary
for r in "${RESULTS[@]}"; do
  case $r in ok | "dry run") ;; *) exit 1 ;; esac
done
exit 0
