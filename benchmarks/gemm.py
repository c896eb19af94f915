"""GEMM baseline: the seed's movement-op matrix multiply, lowered with default Opts and compiled to C, in GFLOP/s beside
NumPy's matmul measured in the same run. The ratio is the figure; the optimization work starts from it.

    python benchmarks/gemm.py [--sizes 256 512 1024] [--repeat 3] [--opts '{"thread": 0, "upcast": {"1": 4}}']
"""
from __future__ import annotations
import argparse, json, pathlib, sys, time
import numpy as np
from uopc.uop import buf
from uopc.uir import parse
from uopc.rangeify import lower, Ctx, Opts
from uopc.linearize import linearize
from uopc.backends.c import CRenderer, compiler, check_buffers, CBackend
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testing"))
from seed_programs import gemm_uir  # noqa: E402  (the same program the tests check against NumPy)


def gemm_program(n: int):
  """C = A @ B with A, B row-major (n, n): the tests' movement-op GEMM (testing/seed_programs.py), at size n."""
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
  ap.add_argument("--opts", default="{}", help="Opts as JSON, e.g. '{\"thread\": 0}' (default: none, the baseline)")
  args = ap.parse_args()
  raw = json.loads(args.opts)
  opts = Opts(**{k: ({int(a): b for a, b in v.items()} if isinstance(v, dict) else v) for k, v in raw.items()})
  print(f"GEMM (float32, movement ops, {opts}), best of {args.repeat}")
  print(f"{'N':>6} {'uopc GFLOP/s':>13} {'numpy GFLOP/s':>14} {'uopc/numpy':>11} {'max |err|':>10} {'compile s':>10}")
  for n in args.sizes:
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal((2, n, n), dtype=np.float32)
    out = np.zeros(n * n, np.float32)
    t0 = time.perf_counter()
    sink = lower(gemm_program(n), buf(2, n * n), Ctx(opts=opts))
    lin = linearize(sink)
    prog = compiler.compile(CRenderer().render(lin, f"gemm{n}"), f"gemm{n}")
    compile_s = time.perf_counter() - t0
    arrays = check_buffers(sink, {0: a.ravel(), 1: b.ravel(), 2: out})
    t_ours = best_of(lambda: CBackend.launch_program(prog, arrays), args.repeat)
    t_np = best_of(lambda: a @ b, args.repeat)
    err = float(np.abs(out.reshape(n, n) - a @ b).max())
    flops = 2 * n ** 3
    print(f"{n:>6} {flops / t_ours / 1e9:>13.2f} {flops / t_np / 1e9:>14.1f} {t_np / t_ours:>11.4f} {err:>10.2e} {compile_s:>10.2f}")


if __name__ == "__main__":
  main()
