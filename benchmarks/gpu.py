"""GPU GEMM speed: uopc's CUDA backend beside PyTorch (cuBLAS) on the same device, in the same run.

    python benchmarks/gpu.py [--sizes 4096,8192] [--repeat 20]

Rows: f16 inputs with f32 accumulation (tensor cores: WMMA m16n8k16 in uopc, cuBLAS's choice in PyTorch) and f32 GEMM,
N x N x N for each size. Each contender runs --repeat times after a warmup (uopc's kernel is captured by uopc.jit, so
a call is one launch); the best time gives TFLOP/s (2 N^3 operations), and the ratio is uopc's over PyTorch's (1.00:
as fast as cuBLAS). On a machine without a CUDA device it says so and exits 0.
"""
from __future__ import annotations
import argparse, sys, time
import numpy as np


def best_time(fn, sync, repeat: int) -> float:
  fn()
  sync()
  best = float("inf")
  for _ in range(repeat):
    t = time.perf_counter()
    fn()
    sync()
    best = min(best, time.perf_counter() - t)
  return best


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", default="4096,8192", help="comma-separated N (default 4096,8192)")
  ap.add_argument("--repeat", type=int, default=20, help="timed calls of each contender (default 20)")
  args = ap.parse_args()
  from uopc.backends.cuda import device_available, default_arch
  if not device_available():
    print("benchmarks/gpu.py: no CUDA device on this machine (the CUDA backend still renders and compiles: nox -s cuda)")
    return 0
  from uopc.backends import get_backend
  from uopc.tensor import Tensor
  from uopc.jit import jit
  backend = get_backend("CUDA")
  try: import torch
  except ImportError: torch = None
  print(f"GPU GEMM on {default_arch()}; PyTorch {torch.__version__ if torch else 'not installed'}")
  print(f"{'':28}{'uopc TFLOP/s':>14}{'torch TFLOP/s':>15}{'uopc/torch':>12}")
  for n in (int(s) for s in args.sizes.split(",")):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    for label, dtype in (("f16 in, f32 accumulate", np.float16), ("f32", np.float32)):
      ta, tb = Tensor(a.astype(dtype), device="CUDA"), Tensor(b.astype(dtype), device="CUDA")
      gemm = jit(lambda x, y: x @ y)   # f16 @ f16 sums in f32 and gives f16, as torch's (and cuBLAS's) does
      ours = best_time(lambda: gemm(ta, tb), backend.synchronize, args.repeat)
      flops = 2 * n ** 3
      row = f"{label + f' {n}':28}{flops / ours / 1e12:>14.1f}"
      if torch is not None and torch.cuda.is_available():
        xa, xb = torch.from_numpy(a.astype(dtype)).cuda(), torch.from_numpy(b.astype(dtype)).cuda()
        theirs = best_time(lambda: xa @ xb, torch.cuda.synchronize, args.repeat)
        row += f"{flops / theirs / 1e12:>15.1f}{theirs / ours:>11.2f}x"
      print(row, flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
