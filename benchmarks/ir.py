"""IR speed: uopc-ir against tinygrad 0.14's IR, measured in the same run, printed as nodes per second and ratios.

    python benchmarks/ir.py [--repeat N]

Three workloads, each done the same way in both IRs with their natural API:
  build     a fresh chain of 200,000 ADDs (x + 1 + 1 + ...), through the operator sugar
  toposort  ordering that chain, sources first
  simplify  a few hundred index expressions (ravel/unravel round trips, div/mod chains) over loop counters,
            each simplified for the first time (fresh expressions every repeat, so no memo is reused)
The best of --repeat runs is reported. tinygrad's column is skipped, with a note, when it can't be imported.
"""
from __future__ import annotations
import argparse, gc, importlib.metadata, time

N_CHAIN = 200_000


def best(fn, repeat: int) -> float:
  times = []
  for _ in range(repeat):
    gc.collect()
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return min(times)


def index_exprs(rng, const, salt: int) -> list:
  """~300 index expressions of the kind rangeify makes; `salt` varies the shapes so each repeat is new work."""
  out = []
  for k in range(60):
    n, m = 4 + (k + salt) % 13, 3 + (k * 7 + salt) % 11
    i, j, l = rng(n, 0), rng(m, 1), rng(5, 2)
    flat = (i * m + j) * 5 + l
    out += [((flat // 5) // m) % n, (flat // 5) % m, flat % 5,            # unravel(ravel(idx)): i, j, l
            ((i * m + j) * 4 + l) // (4 * m) % n,                          # merge-then-split
            (i * (m * 2) + j * 2 + 1) // 2 + (i * m + j) % m * 3]
  return out


def count_nodes(exprs, toposort) -> int:
  seen = set()
  for e in exprs: seen.update(toposort(e))
  return len(seen)


def bench_uopc(repeat: int) -> dict[str, float]:
  from uopc.dtype import dtypes
  from uopc.uop import UOp, Ops, ParamArg, range_
  from uopc.symbolic import simplify
  res: dict[str, float] = {}
  def build():
    c = UOp(Ops.PARAM, (), ParamArg(0, dtypes.i32))
    one = UOp.const(1)
    for _ in range(N_CHAIN): c = c + one
    return c
  res["build"] = N_CHAIN / best(build, repeat)
  chain = build()
  res["toposort"] = (N_CHAIN + 2) / best(chain.toposort, repeat)
  salt = iter(range(1000))
  def simp():
    exprs = index_exprs(lambda n, i: range_(n, i), UOp.const, next(salt))
    t = time.perf_counter()
    for e in exprs: simplify(e)
    return time.perf_counter() - t, count_nodes(exprs, lambda e: e.toposort())
  res["simplify"] = max(n / t for t, n in (simp() for _ in range(repeat)))
  return res


def bench_tinygrad(repeat: int) -> dict[str, float]:
  from tinygrad.uop.ops import UOp
  from tinygrad.dtype import dtypes
  res: dict[str, float] = {}
  def build():
    c = UOp.variable("x", 0, 100)
    one = UOp.const(1, dtypes.weakint)
    for _ in range(N_CHAIN): c = c + one
    return c
  res["build"] = N_CHAIN / best(build, repeat)
  chain = build()
  res["toposort"] = (N_CHAIN + 2) / best(lambda: chain.toposort(), repeat)
  salt = iter(range(1000))
  def simp():
    exprs = index_exprs(lambda n, i: UOp.range(n, i), lambda v: UOp.const(v, dtypes.weakint), next(salt))
    t = time.perf_counter()
    for e in exprs: e.simplify()
    return time.perf_counter() - t, count_nodes(exprs, lambda e: list(e.toposort()))
  res["simplify"] = max(n / t for t, n in (simp() for _ in range(repeat)))
  return res


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repeat", type=int, default=5)
  args = ap.parse_args()
  ours = bench_uopc(args.repeat)
  try:
    import tinygrad  # noqa: F401  (is the reference installed?)
    theirs, note = bench_tinygrad(args.repeat), f"tinygrad {importlib.metadata.version('tinygrad')}"
  except ImportError as e:
    theirs, note = None, f"tinygrad column skipped: it can't be imported ({e}); pip install tinygrad==0.14.0"
  print(f"uopc-ir vs {note}, best of {args.repeat}")
  print(f"{'workload':<10} {'uopc nodes/s':>14} {'tinygrad nodes/s':>18} {'ratio':>7}")
  for k, v in ours.items():
    t = theirs[k] if theirs else None
    print(f"{k:<10} {v:>14,.0f} {(f'{t:,.0f}' if t else '-'):>18} {(f'{v / t:.2f}x' if t else '-'):>7}")


if __name__ == "__main__":
  main()
