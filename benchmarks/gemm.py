"""GEMM: the movement-op matrix multiply (testing/example_programs.gemm_uir) as one kernel, compiled through uopc.runtime (with the Opts given, or
uopc.opt's choice) and launched on the C backend's Buffers, in GFLOP/s beside NumPy's matmul measured in the same run.

    python benchmarks/gemm.py [--sizes 256 512 1024] [--repeat 3] [--opts '{"thread": 0, "upcast": {"1": 4}}']
"""
from __future__ import annotations
import argparse, json, pathlib, sys, time
import numpy as np
from uopc.dtype import dtypes
from uopc.uop import buf
from uopc.uir import parse
from uopc.rangeify import Opts
from uopc.kernelize import make_kernel
from uopc.backends import get_backend
from uopc.runtime import Buffer, compile_kernel
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testing"))
from example_programs import gemm_uir  # noqa: E402  (the same program the tests check against NumPy)


def gemm_program(n: int):
  """C = A @ B with A, B row-major (n, n): the tests' movement-op GEMM (testing/example_programs.py), at size n."""
  return parse(gemm_uir(n))


def best_of(fn, repeat: int) -> float:
  times = []
  for _ in range(repeat):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return min(times)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
  ap.add_argument("--repeat", type=int, default=3)
  ap.add_argument("--opts", help="Opts as JSON, e.g. '{\"thread\": 0}' (default: what uopc.opt chooses)")
  args = ap.parse_args()
  raw = json.loads(args.opts) if args.opts else None
  opts = None if raw is None else Opts(**{k: ({int(a): b for a, b in v.items()} if isinstance(v, dict) else v) for k, v in raw.items()})
  backend = get_backend("C")
  print(f"GEMM (float32, movement ops, {opts or 'the Opts uopc.opt chooses'}), best of {args.repeat}")
  print(f"{'N':>6} {'uopc GFLOP/s':>13} {'numpy GFLOP/s':>14} {'uopc/numpy':>11} {'max |err|':>10} {'compile s':>10}")
  for n in args.sizes:
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((2, n, n), dtype=np.float32)
    t0 = time.perf_counter()
    prog = compile_kernel(make_kernel(gemm_program(n), buf(2, n * n), canonical=False), backend, opts, name=f"gemm{n}")
    compile_s = time.perf_counter() - t0
    bufs = [Buffer.from_numpy(a.ravel(), backend), Buffer.from_numpy(b.ravel(), backend), Buffer(backend, n * n, dtypes.f32)]
    t_ours = best_of(lambda: prog(bufs), args.repeat)
    t_np = best_of(lambda: a @ b, args.repeat)
    err = float(np.abs(bufs[2].numpy().reshape(n, n) - a @ b).max())
    flops = 2 * n ** 3
    print(f"{n:>6} {flops / t_ours / 1e9:>13.2f} {flops / t_np / 1e9:>14.1f} {t_np / t_ours:>11.4f} {err:>10.2e} {compile_s:>10.2f}")


if __name__ == "__main__":
  main()
