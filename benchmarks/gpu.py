"""GPU GEMM speed: uopc's CUDA backend beside PyTorch (cuBLAS) on the same device, in the same run, each row beside its
roofline on an H200.

    python benchmarks/gpu.py [--sizes 4096,8192] [--repeat 20] [--dtypes f16,f32]
    python benchmarks/gpu.py --gpt default,nanogpt      # the GPT training step on the device instead

Rows: f16 inputs with f32 accumulation (tensor cores: WMMA m16n8k16 in uopc, cuBLAS's choice in PyTorch) and f32 GEMM,
N x N x N for each size. Each contender runs --repeat times after a warmup (uopc's kernel is captured by uopc.jit, so
a call is one launch); the best time gives TFLOP/s (2 N^3 operations), and the ratio is uopc's over PyTorch's (1.00:
as fast as cuBLAS); `max err` is the largest difference between uopc's product and PyTorch's, over the largest
element of PyTorch's.

With --gpt: the GPT training step of benchmarks/gpt.py (the same models, weights and batches) on the device, uopc's
jitted step beside PyTorch eager's on CUDA, each step ending in the loss's .item() (a synchronization, as in a training
loop that prints it): the first step (uopc compiles every kernel then), the loss after the warm-up steps (the two should
agree to a few digits) and the best of three rounds' mean step.

Beside each GEMM row: the FLOPs and the bytes its kernels move at the least (runtime.Program.flops, 2 N^3 for a GEMM
however it is lowered, and Program.nbytes, every parameter once, summed over the kernels), and the roofline bound on
an H200 SXM, max(FLOPs / peak, bytes / bandwidth), with `roof` the share of it a measured row reaches (100%: at the
roofline). The figures are NVIDIA's H200 datasheet's (nvidia.com/h200, H200 SXM column): FP16/BF16 Tensor Core 1,979
TFLOP/s with sparsity, so 989 dense (an f16 GEMM); FP32 67 TFLOP/s (CUDA cores: uopc's f32 GEMM; cuBLAS may use TF32
tensor cores only when asked, PyTorch's default doesn't); GPU memory bandwidth 4.8 TB/s (HBM3e). On a machine without
a CUDA device it says so, prints each row's FLOPs, bytes and bound (the kernels compiled for sm_90 where nvcc or NVRTC
is present), and exits 0.
"""
from __future__ import annotations
import argparse, sys, time
import numpy as np

H200_PEAK = {"f16": 989e12, "f32": 67e12}     # FLOP/s: dense FP16 tensor cores; FP32 CUDA cores (H200 SXM datasheet)
H200_BANDWIDTH = 4.8e12                       # bytes/s: HBM3e (H200 SXM datasheet)
DTYPES = {"f16": ("f16 in, f32 accumulate", np.float16), "f32": ("f32", np.float32)}


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


def roofline(flops: int, nbytes: int, dtype: str) -> tuple[float, str]:
  """The least time an H200 SXM needs for `flops` operations on `nbytes` bytes, and which of the two bounds it."""
  compute, memory = flops / H200_PEAK[dtype], nbytes / H200_BANDWIDTH
  return (compute, "compute") if compute >= memory else (memory, "memory")


def gemm_cost(n: int, dtype: str) -> tuple[int, int, int]:
  """(FLOPs, bytes, kernels) of uopc's n x n x n GEMM on CUDA: the Programs' flops and nbytes summed over the kernels of
  its schedule (compiled: for the device's architecture, else sm_90), or without a CUDA compiler, 2 n^3 and the
  operands and the output once."""
  from uopc import runtime
  from uopc.backends import CompileError, get_backend
  from uopc.dtype import dtypes
  from uopc.tensor import Tensor
  from uopc.tensor.storage import new_buffer
  dt = dtypes.f16 if dtype == "f16" else dtypes.f32
  a, b = (Tensor(new_buffer(n * n, dt).reshape((n, n)), device="CUDA") for _ in range(2))   # no data: only the kernels
  kernels = (a @ b).schedule()
  try: programs = [runtime.compile_kernel(k, get_backend("CUDA")) for k in kernels]
  except CompileError: return 2 * n ** 3, 3 * n * n * dt.itemsize, len(kernels)
  return sum(p.flops for p in programs), sum(p.nbytes for p in programs), len(programs)


def cost_columns(n: int, dtype: str) -> tuple[str, float]:
  """The FLOPs, bytes and H200 roofline columns of a row, and the bound in seconds."""
  flops, nbytes, kernels = gemm_cost(n, dtype)
  bound, by = roofline(flops, nbytes, dtype)
  return f"{flops / 1e9:>11.0f}{nbytes / 1e6:>10.0f}{bound * 1e6:>10.1f} us {by:<8}{kernels:>4}", bound


COST_HEADER = f"{'GFLOP':>11}{'MB':>10}{'H200 bound':>13} {'':<8}{'krn':>4}"


def gpt_rows(sizes: list[str]) -> None:
  """The GPT training step on CUDA, uopc (jitted) beside PyTorch eager, one line per model size."""
  import os, tempfile
  from pathlib import Path
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import gpt as bench                     # benchmarks/gpt.py: the models, their batches and the CPU contenders
  from uopc.gpt import GPTConfig
  os.environ["UOPC_DEVICE"] = "CUDA"      # where uopc's tensors are made by default
  try: import torch
  except ImportError: torch = None
  print(f"GPT training step on CUDA (jitted uopc; PyTorch {torch.__version__ if torch else 'not installed'} eager)")
  print(f"{'':10}{'uopc first':>12}{'uopc step':>11}{'uopc loss':>11}{'torch first':>13}{'torch step':>12}{'torch loss':>12}{'torch/uopc':>12}")
  for size in sizes:
    cfg_kw, batch = bench.SIZES[size]
    warm, per_round = bench.SCHEDULE[size]
    data = bench.batches(GPTConfig(**cfg_kw), batch, warm + per_round)
    with tempfile.TemporaryDirectory() as d:
      state = Path(d) / "state.npz"
      contenders = [("uopc", lambda: bench.uopc_trainer(cfg_kw, state, plain=False))]
      if torch is not None and torch.cuda.is_available():
        contenders.append(("torch", lambda: bench.torch_trainer(GPTConfig(**cfg_kw), state, compiled=False, device="cuda")))
      got = {}
      for name, make in contenders:
        first, loss, best = bench.train_timed(make(), data, warm, 3)
        got[name] = (first, best, loss)
    row = f"{size:10}" + "".join(f"{got[n][0]:>11.2f}s{got[n][1] * 1e3:>9.2f}ms{got[n][2]:>11.4f} " for n in got)
    if "torch" in got: row += f"{got['torch'][1] / got['uopc'][1]:>11.2f}x"
    print(row, flush=True)


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", default="4096,8192", help="comma-separated N (default 4096,8192)")
  ap.add_argument("--repeat", type=int, default=20, help="timed calls of each contender (default 20)")
  ap.add_argument("--dtypes", default="f16,f32", help="comma-separated rows per size, of f16 and f32 (default f16,f32)")
  ap.add_argument("--gpt", default="", help="comma-separated GPT sizes among default, nanogpt: time the training step instead")
  args = ap.parse_args()
  if args.gpt:
    from uopc.backends.cuda import device_available
    if not device_available():
      print("benchmarks/gpu.py --gpt: no CUDA device on this machine: nothing to time")
      return 0
    gpt_rows([s.strip() for s in args.gpt.split(",")])
    return 0
  sizes = [int(s) for s in args.sizes.split(",")]
  rows = [d.strip() for d in args.dtypes.split(",")]
  if bad := [d for d in rows if d not in DTYPES]: ap.error(f"--dtypes: {bad} are not among {sorted(DTYPES)}")
  from uopc.backends.cuda import device_available, default_arch
  if not device_available():
    print("benchmarks/gpu.py: no CUDA device on this machine (the CUDA backend still renders and compiles: nox -s cuda); "
          f"the rows it would measure, with their H200 roofline (kernels for {default_arch()}):")
    print(f"{'':28}{COST_HEADER}")
    for n in sizes:
      for d in rows: print(f"{DTYPES[d][0] + f' {n}':28}{cost_columns(n, d)[0]}", flush=True)
    return 0
  from uopc.backends import get_backend
  from uopc.tensor import Tensor
  from uopc.jit import jit
  backend = get_backend("CUDA")
  try: import torch
  except ImportError: torch = None
  print(f"GPU GEMM on {default_arch()}; PyTorch {torch.__version__ if torch else 'not installed'}; roof: uopc's time against the H200 bound")
  print(f"{'':28}{'uopc TFLOP/s':>14}{'roof':>6}{'torch TFLOP/s':>15}{'uopc/torch':>12}{'max err':>10}  {COST_HEADER}")
  for n in sizes:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((n, n), np.float32), rng.standard_normal((n, n), np.float32)
    for d in rows:
      label, dtype = DTYPES[d]
      ta, tb = Tensor(a.astype(dtype), device="CUDA"), Tensor(b.astype(dtype), device="CUDA")
      gemm = jit(lambda x, y: x @ y)   # f16 @ f16 sums in f32 and gives f16, as torch's (and cuBLAS's) does
      ours = best_time(lambda: gemm(ta, tb), backend.synchronize, args.repeat)
      flops = 2 * n ** 3
      costs, bound = cost_columns(n, d)
      row = f"{label + f' {n}':28}{flops / ours / 1e12:>14.1f}{bound / ours:>6.0%}"
      if torch is not None and torch.cuda.is_available():
        xa, xb = torch.from_numpy(a.astype(dtype)).cuda(), torch.from_numpy(b.astype(dtype)).cuda()
        theirs = best_time(lambda: xa @ xb, torch.cuda.synchronize, args.repeat)
        # the same product both ways: a fast wrong answer is no answer (f16 outputs differ in their last bits)
        mine, ref = gemm(ta, tb).numpy().astype(np.float32), (xa @ xb).float().cpu().numpy()
        err = float(np.abs(mine - ref).max() / max(float(np.abs(ref).max()), 1e-30))
        row += f"{flops / theirs / 1e12:>15.1f}{theirs / ours:>11.2f}x{err:>10.1e}"
      else: row += f"{'-':>15}{'-':>12}{'-':>10}"
      print(f"{row}  {costs}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
