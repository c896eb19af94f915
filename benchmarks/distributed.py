"""Data-parallel training over MPI (uopc.distributed): the same training as one process, and what it costs here.

    python benchmarks/distributed.py            # needs uopc-tensor[dist] (mpi4py and the mpich wheel's mpiexec)

1. Equivalence: `uopc gpt train` (the addition task and its default model) for 50 steps with --batch 64 in one process
   and on 2 ranks of 32, and with --batch 96 in one process and on 3 ranks of 32: the loss after 50 steps (the step's
   training loss, the mean over the whole batch) and the largest difference of any weight.
2. Scaling: benchmarks/gpt.py's default GPT (batch 16) per training step, one process on 2 threads against 2 ranks on
   one thread each (the machine's 2 cores either way), with the allreduce's time per step and its share of the step;
   then the allreduce alone of the default GPT's 0.42M parameters and nanoGPT's 10.8M on 2 ranks, against the step
   times benchmarks/gpt.py measures, which is what limits scaling.
Each measurement runs in processes of its own (this script calls itself with --worker).
"""
from __future__ import annotations
import argparse, json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np

HERE = Path(__file__).resolve().parent
MPIEXEC = shutil.which("mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
STEPS = 50
WARM, TIMED = 10, 30


def run(cmd: list, threads: int, ranks: int | None = None) -> subprocess.CompletedProcess:
  env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
  full = ([MPIEXEC, "-n", str(ranks)] if ranks else []) + [sys.executable, *map(str, cmd)]
  r = subprocess.run(full, env=env, capture_output=True, text=True)
  if r.returncode: raise SystemExit(f"{' '.join(map(str, full))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
  return r


# ---- 1. equivalence ---------------------------------------------------------------------------------------------------

def equivalence(tmp: Path) -> None:
  from uopc import nn
  print(f"equivalence: uopc gpt train (addition, default model), {STEPS} steps, seed 0")
  print(f"  {'run':<30} {'loss after 50':>14} {'vs one process':>15} {'largest weight difference':>27}")
  for batch, ranks in ((64, 2), (96, 3)):
    losses, weights = {}, {}
    for n in (1, ranks):
      out = tmp / f"b{batch}-n{n}"
      cmd = ["-m", "uopc.cli", "gpt", "train", "--steps", STEPS, "--batch", batch, "--out", out]
      run(cmd, threads=2 if n == 1 else 1, ranks=n if n > 1 else None)
      tensors, meta = nn.safe_load(out / "model.safetensors", with_metadata=True)
      losses[n] = json.loads(meta["history"])[-1][1]        # the last step's loss, as the run computed it (not rounded)
      weights[n] = {k: v.numpy() for k, v in tensors.items()}
    diff = max(float(np.abs(weights[ranks][k] - weights[1][k]).max()) for k in weights[1])
    # the key projection's bias doesn't change the loss (softmax ignores a constant added to a query's scores): its
    # gradient is rounding noise that AdamW scales to full steps, so it is shown apart
    def rest(k, a): return np.delete(a, np.s_[a.shape[0] // 3: 2 * a.shape[0] // 3]) if k.endswith("attn.bias") else a
    diff_rest = max(float(np.abs(rest(k, weights[ranks][k]) - rest(k, weights[1][k])).max()) for k in weights[1])
    print(f"  {'1 process x ' + str(batch):<30} {losses[1]:14.7f}")
    print(f"  {f'{ranks} ranks x {batch // ranks}':<30} {losses[ranks]:14.7f} {abs(losses[ranks] - losses[1]):15.2e} "
          f"{diff_rest:10.2e} ({diff:.2e} with the key bias)")


# ---- 2. scaling ---------------------------------------------------------------------------------------------------------

def worker_step() -> None:
  """One training run of benchmarks/gpt.py's default GPT under uopc.distributed; rank 0 prints its figures as JSON."""
  sys.path.insert(0, str(HERE))
  import gpt as G
  from uopc.tensor import Tensor
  from uopc import nn, distributed as dist
  from uopc.gpt import GPT, GPTConfig, training_step
  rank, world = dist.init()
  cfg_kw, batch = G.SIZES["default"]
  Tensor.manual_seed(0)
  model = GPT(GPTConfig(**cfg_kw))
  opt = nn.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
  step = training_step(model, opt)
  data = G.batches(model.cfg, batch, WARM + TIMED)
  rows = slice(rank * batch // world, (rank + 1) * batch // world)
  def one(x, y): return step(Tensor(x[rows]), Tensor(y[rows])).item()
  for x, y in data[:WARM]: one(x, y)
  dist.barrier()
  before, start = dist.stats(), time.perf_counter()
  for x, y in data[WARM:]: loss = one(x, y)
  seconds = time.perf_counter() - start
  reduce = dist.stats()["seconds"] - before["seconds"]
  if rank == 0: print(json.dumps({"step_ms": seconds / TIMED * 1e3, "allreduce_ms": reduce / TIMED * 1e3, "loss": loss}))


def worker_allreduce(size: str) -> None:
  """The allreduce of a GPT's gradients alone (its parameters' shapes), timed over 10 calls; rank 0 prints JSON."""
  sys.path.insert(0, str(HERE))
  import gpt as G
  from uopc.tensor import Tensor
  from uopc import distributed as dist
  from uopc.gpt import GPTConfig, parameter_shapes
  dist.init()
  shapes = parameter_shapes(GPTConfig(**G.SIZES[size][0]))
  grads = [Tensor(np.ones(s, np.float32)).realize() for s in shapes.values()]
  dist.allreduce(grads)
  dist.barrier()
  start = time.perf_counter()
  for _ in range(10): dist.allreduce(grads)
  ms = (time.perf_counter() - start) / 10 * 1e3
  if dist.rank() == 0:
    n = sum(int(np.prod(s)) for s in shapes.values())
    print(json.dumps({"params": n, "ms": ms, "gbps": n * 4 / (ms / 1e3) / 1e9}))


def scaling() -> None:
  print("\nscaling: benchmarks/gpt.py's default GPT (421,632 parameters, batch 16), the machine's 2 cores either way")
  print(f"  {'':<26} {'ms per step':>12} {'allreduce ms':>13} {'share':>7}")
  for label, threads, ranks in (("1 process x 2 threads", 2, None), ("2 ranks x 1 thread", 1, 2)):
    r = json.loads(run([__file__, "--worker", "step"], threads, ranks).stdout.strip().splitlines()[-1])
    share = r["allreduce_ms"] / r["step_ms"]
    print(f"  {label:<26} {r['step_ms']:12.2f} {r['allreduce_ms']:13.3f} {share:7.1%}")
  print("\n  the allreduce of a step's gradients alone, 2 ranks x 1 thread:")
  for size in ("default", "nanogpt"):
    r = json.loads(run([__file__, "--worker", "allreduce", "--size", size], 1, 2).stdout.strip().splitlines()[-1])
    print(f"  {size:<10} {r['params']:>12,} parameters  {r['ms']:9.2f} ms  {r['gbps']:6.2f} GB/s of gradients")


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--only", help="comma-separated among equivalence, scaling")
  ap.add_argument("--worker", choices=["step", "allreduce"], help=argparse.SUPPRESS)
  ap.add_argument("--size", default="default", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker == "step": return worker_step()
  if args.worker == "allreduce": return worker_allreduce(args.size)
  try: import mpi4py  # noqa: F401
  except ImportError: raise SystemExit("benchmarks/distributed.py needs uopc-tensor[dist] (mpi4py and the mpich wheel)") from None
  if MPIEXEC is None: raise SystemExit("no mpiexec on PATH or beside this python (the mpich wheel installs one)")
  parts = args.only.split(",") if args.only else ["equivalence", "scaling"]
  print(f"{os.cpu_count()} CPUs; mpiexec {MPIEXEC}; every run in processes of its own")
  with tempfile.TemporaryDirectory() as tmp:
    if "equivalence" in parts: equivalence(Path(tmp))
  if "scaling" in parts: scaling()


if __name__ == "__main__":
  main()
