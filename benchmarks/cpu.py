"""CPU speed: uopc through the Tensor API beside NumPy and PyTorch, measured in the same run, as ratios.

    python benchmarks/cpu.py [--repeat 7] [--passes 2] [--only gemm,sum] [--warm-cache]

Rows: GEMM 256/512/1024/2048 and two sizes that are no power of two (1000, and 997, a prime), attention forward and
forward+backward (N=512, d=64), conv2d (batch 8, 64->64 channels, 32x32, 3x3, padding 1), the sum and a*x+b of 16M f32,
a 2048 x 2048 transpose copied, 4096 rows of a 2048 x 1024 tensor picked by an index tensor (x[idx]), the MLP step of
benchmarks/tensor.py and the GPT training step (vocab 65, context 64, batch 16, 2 layers, width 128, 4 heads, AdamW).
The attention, sum, a*x+b, MLP and GPT rows run twice:
calling the Tensor code each time, and under uopc.jit (its first two calls run and capture, replays are timed),
which is how a training loop runs it; the difference is the Python cost of building and scheduling the graph.

Each row shows the first uopc call (it compiles: the compile cache is a fresh directory unless --warm-cache), then
each contender's best of three rounds of --repeat calls (the GPT rows after 8 more: a training loop's steady state),
and the ratio of the better peer's time to uopc's (above 1: uopc is faster). Every contender of every row runs in a
process of its own (this script calls itself with --worker): OpenBLAS, PyTorch and OpenMP all keep their threads
spinning a while after a parallel region, which on two cores costs whoever runs next beside them up to half the machine.
The contenders of a row run in turn --passes times (2 by default), each keeping its best: on a shared VM the machine's
speed moves by up to 2x within minutes, and a row measured once could put each contender in a different phase of it.
NumPy has no autograd or conv: its backward passes are written out by hand here; the GPT step has no NumPy column.
With UOPC_DEBUG=1 every kernel prints its GFLOP/s or GB/s.
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np

if "--warm-cache" not in sys.argv and "UOPC_CACHE_DIR" not in os.environ:
  os.environ["UOPC_CACHE_DIR"] = tempfile.mkdtemp(prefix="uopc-bench-cache-")   # first calls include gcc
from uopc.tensor import Tensor                     # noqa: E402
from uopc import nn                                # noqa: E402
from uopc.backends import get_backend              # noqa: E402

CONTENDERS = ("uopc", "numpy", "torch")
# a worker imports PyTorch only when it is the torch contender (its thread pool must not exist beside the others)
_worker_of = sys.argv[sys.argv.index("--worker") + 2] if "--worker" in sys.argv[:-2] else None
torch = None
if _worker_of == "torch":   # (the parent only asks whether a worker could import it)
  try:
    import torch
    torch.set_num_threads(get_backend("C").caps.threads)
  except ImportError: torch = None


ROUNDS = 3


def timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


class Row:
  """One benchmark: three callables (uopc, numpy, torch; None when a contender has none) and the work of one call."""
  def __init__(self, name, ours, ref_np, ref_torch, flops=0, nbytes=0, warmup=0):
    self.name, self.ours, self.ref_np, self.ref_torch, self.flops, self.nbytes = name, ours, ref_np, ref_torch, flops, nbytes
    self.warmup = warmup   # untimed calls after the first: a row a loop runs thousands of times is timed as the loop runs

  def measure(self, contender: str, repeat: int) -> dict | None:
    """In a worker: the contender's first call and its best of ROUNDS rounds of `repeat` calls (None: it has none)."""
    f = dict(zip(CONTENDERS, (self.ours, self.ref_np, self.ref_torch)))[contender]
    if f is None: return None
    first = timed(f)
    for _ in range(self.warmup): f()
    return {"first": first, "best": min(timed(f) for _ in range(ROUNDS * repeat))}

  def line(self, results: dict[str, dict | None]) -> str:
    """The row's line from each contender's measure()."""
    ours = results["uopc"]
    t_ours = ours["best"]
    peers = {k: r["best"] for k, r in results.items() if k != "uopc" and r is not None}
    def rate(t: float) -> str:
      if self.flops: return f"{self.flops / t / 1e9:8.1f} GFLOP/s"
      if self.nbytes: return f"{self.nbytes / t / 1e9:8.1f} GB/s   "
      return f"{t * 1e3:8.2f} ms     "
    cols = [f"{self.name:<22}", f"first {ours['first']:6.2f} s", f"uopc {t_ours * 1e3:9.3f} ms {rate(t_ours)}"]
    for k in ("numpy", "torch"):
      cols.append(f"{k} {peers[k] * 1e3:9.3f} ms {rate(peers[k])}" if k in peers else f"{k} {'-':>9}               ")
    better = min(peers.values()) if peers else None
    cols.append(f"ratio {better / t_ours:5.2f}" if better else "ratio     -")
    return "  ".join(cols)


def gemm(n: int) -> Row:
  rng = np.random.default_rng(n)
  a, b = rng.standard_normal((2, n, n), dtype=np.float32)
  ta, tb = Tensor(a), Tensor(b)
  xa, xb = (torch.from_numpy(a), torch.from_numpy(b)) if torch else (None, None)
  return Row(f"gemm {n}", lambda: (ta @ tb).realize(), lambda: a @ b, (lambda: xa @ xb) if torch else None, flops=2 * n ** 3)


def _attention_np(q, k, v):
  s = q @ k.T / 8
  e = np.exp(s - s.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)


def attention(backward: bool, use_jit: bool = False) -> Row:
  rng = np.random.default_rng(1)
  Q, K, V, R = (rng.standard_normal((512, 64)).astype(np.float32) for _ in range(4))
  flops = 2 * 2 * 512 * 512 * 64 * (3 if backward else 1)
  if not backward:
    q, k, v = Tensor(Q), Tensor(K), Tensor(V)
    xq, xk, xv = (torch.from_numpy(a) for a in (Q, K, V)) if torch else (None,) * 3
    fwd = lambda a, b, c: (((a @ b.T) / 8).softmax(-1) @ c).realize()
    ours = _jitted(fwd, q, k, v) if use_jit else (lambda: fwd(q, k, v))
    return Row("attention fwd" + (" (jit)" if use_jit else ""), ours, lambda: _attention_np(Q, K, V) @ V,
               (lambda: torch.softmax(xq @ xk.T / 8, -1) @ xv) if torch else None, flops=flops)
  q, k, v = (Tensor(a, requires_grad=True) for a in (Q, K, V))
  r = Tensor(R)
  def step(q=q, k=k, v=v):
    for t in (q, k, v): t.grad = None
    out = ((q @ k.T) / 8).softmax(-1) @ v
    (out * r).sum().backward()
    Tensor.realize(out, q.grad, k.grad, v.grad)
    return out, q.grad, k.grad, v.grad
  # q, k, v are the jitted step's arguments: as state it never writes, a replay would skip every kernel that reads
  # them alone (the scores, the softmax), and the row would time 4 of its 16 kernels
  ours = _jitted(step, q, k, v) if use_jit else step
  def ref_np():   # the same gradients, by hand
    p = _attention_np(Q, K, V)
    dp = R @ V.T
    ds = p * (dp - (dp * p).sum(1, keepdims=True)) / 8
    return p @ V, ds @ K, ds.T @ Q, p.T @ R
  def ref_torch():
    xq, xk, xv = (torch.from_numpy(a).requires_grad_() for a in (Q, K, V))
    out = torch.softmax(xq @ xk.T / 8, -1) @ xv
    (out * torch.from_numpy(R)).sum().backward()
  return Row("attention fwd+bwd" + (" (jit)" if use_jit else ""), ours, ref_np, ref_torch if torch else None, flops=flops)


def conv2d() -> Row:
  rng = np.random.default_rng(2)
  X = rng.standard_normal((8, 64, 32, 32)).astype(np.float32)
  W = (rng.standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
  x, w = Tensor(X), Tensor(W)
  def ref_np():   # im2col by a sliding window view, then one matmul
    win = np.lib.stride_tricks.sliding_window_view(np.pad(X, ((0, 0), (0, 0), (1, 1), (1, 1))), (3, 3), axis=(2, 3))   # (8,64,32,32,3,3)
    return np.tensordot(win, W, axes=([1, 4, 5], [1, 2, 3]))
  xt, wt = (torch.from_numpy(X), torch.from_numpy(W)) if torch else (None, None)
  return Row("conv2d 8x64x32x32 3x3", lambda: x.conv2d(w, padding=1).realize(), ref_np,
             (lambda: torch.nn.functional.conv2d(xt, wt, padding=1)) if torch else None, flops=2 * 8 * 64 * 32 * 32 * 64 * 9)


def reduce_sum(use_jit: bool = False) -> Row:
  X = np.random.default_rng(3).standard_normal(1 << 24).astype(np.float32)
  x = Tensor(X)
  xt = torch.from_numpy(X) if torch else None
  ours = _jitted(lambda a: a.sum().realize(), x) if use_jit else (lambda: x.sum().realize())
  return Row("sum 16M" + (" (jit)" if use_jit else ""), ours, lambda: X.sum(), (lambda: xt.sum()) if torch else None, nbytes=X.nbytes)


def axpy(use_jit: bool = False) -> Row:
  X = np.random.default_rng(4).standard_normal(1 << 24).astype(np.float32)
  x = Tensor(X)
  xt = torch.from_numpy(X) if torch else None
  ours = _jitted(lambda a: (a * 2.0 + 1.0).realize(), x) if use_jit else (lambda: (x * 2.0 + 1.0).realize())
  return Row("a*x+b 16M" + (" (jit)" if use_jit else ""), ours, lambda: X * np.float32(2) + np.float32(1),
             (lambda: xt * 2.0 + 1.0) if torch else None, nbytes=2 * X.nbytes)


def _jitted(fn, *args):
  """fn(*args) under uopc.jit, as a benchmark callable: the first two calls run and capture, the rest replay."""
  from uopc.jit import jit
  f = jit(fn)
  return lambda: f(*args)


def mlp(use_jit: bool = False) -> Row:
  rng = np.random.default_rng(5)
  X = rng.standard_normal((256, 784)).astype(np.float32)
  Y = rng.integers(0, 10, 256).astype(np.int32)
  W1, W2 = (rng.standard_normal((784, 256)) / 28).astype(np.float32), (rng.standard_normal((256, 10)) / 16).astype(np.float32)
  b1, b2 = np.zeros(256, np.float32), np.zeros(10, np.float32)
  params = [Tensor(a, requires_grad=True) for a in (W1, b1, W2, b2)]
  x, y = Tensor(X), Tensor(Y)
  def step(x=x, y=y, *ps):
    ps = ps or params
    for p in ps: p.grad = None
    loss = ((x @ ps[0] + ps[1]).relu() @ ps[2] + ps[3]).cross_entropy(y)
    loss.backward()
    Tensor.realize(loss, *[p.grad for p in ps])
    return [loss] + [p.grad for p in ps]
  # the data and the weights are the jitted step's arguments, as a training loop's batches and updated weights are
  # new values at every step: as state nothing writes, a replay skips what reads them alone (here, everything)
  ours = _jitted(step, x, y, *params) if use_jit else step
  def ref_np():
    h = X @ W1 + b1
    a = np.maximum(h, 0)
    z = a @ W2 + b2
    e = np.exp(z - z.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    dz = p.copy()
    dz[np.arange(256), Y] -= 1
    dz /= 256
    dW2, db2 = a.T @ dz, dz.sum(0)
    dh = (dz @ W2.T) * (h > 0)
    return dW2, db2, X.T @ dh, dh.sum(0)
  def ref_torch():
    ps = [torch.from_numpy(a).requires_grad_() for a in (W1, b1, W2, b2)]
    loss = torch.nn.functional.cross_entropy((torch.from_numpy(X) @ ps[0] + ps[1]).relu() @ ps[2] + ps[3], torch.from_numpy(Y).long())
    loss.backward()
  return Row("mlp step 784-256-10" + (" (jit)" if use_jit else ""), ours, ref_np, ref_torch if torch else None,
             flops=3 * 2 * 256 * (784 * 256 + 256 * 10))


def gpt(use_jit: bool = False) -> Row:
  from uopc.gpt import GPT, GPTConfig
  cfg = GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4)
  Tensor.manual_seed(0)
  model = GPT(cfg)
  opt = nn.AdamW(model.parameters(), lr=1e-3)
  rng = np.random.default_rng(6)
  T, Yt = rng.integers(0, 65, (16, 64)).astype(np.int32), rng.integers(0, 65, (16, 64)).astype(np.int32)
  tokens, targets = Tensor(T), Tensor(Yt)
  def step(x=tokens, y=targets):
    opt.zero_grad()
    loss = model.loss(x, y)
    loss.backward()
    opt.step()
    return loss
  if use_jit:
    from uopc.jit import jit
    jitted = jit(step)
    ours = lambda: jitted(tokens, targets).item()
  else: ours = lambda: step().item()
  ref_torch = _torch_gpt(cfg, model, T, Yt) if torch else None
  # a training loop's steady state: a remembered schedule's launches run as one native call from its 8th run
  # (uopc.runtime._PlannedGraph), which the timed calls would otherwise never reach; every contender warms alike
  return Row("gpt step (AdamW)" + (" (jit)" if use_jit else ""), ours, None, ref_torch, warmup=8)


def _torch_gpt(cfg, model, T, Y):
  """The same model in PyTorch eager (benchmarks/gpt.py's, from uopc's weights): one training step per call."""
  from gpt import torch_trainer
  state = Path(tempfile.mkdtemp(prefix="uopc-bench-")) / "gpt.npz"
  np.savez(state, **{k: v.numpy() for k, v in nn.get_state_dict(model).items()})
  step = torch_trainer(cfg, state, compiled=False)
  return lambda: step(T, Y)


def transpose() -> Row:
  X = np.random.default_rng(6).standard_normal((2048, 2048)).astype(np.float32)
  x = Tensor(X)
  xt = torch.from_numpy(X) if torch else None
  return Row("transpose 2048x2048", lambda: x.T.contiguous().realize(), lambda: np.ascontiguousarray(X.T),
             (lambda: xt.T.contiguous()) if torch else None, nbytes=2 * X.nbytes)


def gather() -> Row:
  rng = np.random.default_rng(7)
  X, I = rng.standard_normal((2048, 1024)).astype(np.float32), rng.integers(0, 2048, 4096).astype(np.int32)
  x, i = Tensor(X), Tensor(I)
  xt, it = (torch.from_numpy(X), torch.from_numpy(I.astype(np.int64))) if torch else (None, None)
  return Row("gather 4096 of 2048 rows", lambda: x[i].realize(), lambda: X[I], (lambda: xt[it]) if torch else None, nbytes=2 * 4096 * 1024 * 4)


ROWS = {"gemm": lambda: [gemm(n) for n in (256, 512, 1024, 2048, 1000, 997)],
        "attention": lambda: [attention(False), attention(False, True), attention(True), attention(True, True)],
        "conv": lambda: [conv2d()], "sum": lambda: [reduce_sum(), reduce_sum(True)], "axpy": lambda: [axpy(), axpy(True)],
        "transpose": lambda: [transpose()], "gather": lambda: [gather()],
        "mlp": lambda: [mlp(), mlp(True)],
        "gpt": lambda: [gpt(), gpt(True)]}


def worker(key: str, contender: str, index: int, repeat: int) -> dict | None:
  """One contender of one row (the index-th row of ROWS[key]) measured in this process."""
  return ROWS[key]()[index].measure(contender, repeat)


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--repeat", type=int, default=7)
  ap.add_argument("--passes", type=int, default=2, help="times each row's contenders run in turn (best of them counts)")
  ap.add_argument("--only", help=f"comma-separated rows among {', '.join(ROWS)}")
  ap.add_argument("--warm-cache", action="store_true", help="keep $UOPC_CACHE_DIR (first calls then skip gcc)")
  ap.add_argument("--worker", nargs=3, metavar=("ROW", "CONTENDER", "INDEX"), help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    key, contender, index = args.worker
    print(json.dumps(worker(key, contender, int(index), args.repeat if key != "gpt" else max(2, args.repeat // 3))))
    return
  caps = get_backend("C").caps
  has_torch = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0
  print(f"uopc C backend: {caps.threads} threads, {caps.vector_width} f32 lanes, fma {caps.fma}; numpy {np.__version__}; "
        f"torch {'found' if has_torch else 'not installed'}; every contender in its own process; compile cache {os.environ['UOPC_CACHE_DIR']}")
  for key in (args.only.split(",") if args.only else ROWS):
    rows = ROWS[key]()       # for the names and the work of each row; the workers build their own
    for index, row in enumerate(rows):
      results: dict[str, dict | None] = {}
      for _ in range(max(1, args.passes)):
        for contender in CONTENDERS:
          if contender == "torch" and not has_torch: results[contender] = None; continue
          p = subprocess.run([sys.executable, __file__, "--worker", key, contender, str(index), "--repeat", str(args.repeat)],
                             capture_output=True, text=True)
          if p.returncode: sys.exit(f"{row.name}, {contender}: the worker failed:\n{p.stderr}")
          got = json.loads(p.stdout.strip().splitlines()[-1])
          # the first pass's first call (a cold compile cache), the best time of any pass
          if (had := results.get(contender)) is not None: got = {"first": had["first"], "best": min(had["best"], got["best"])}
          results[contender] = got
      print(row.line(results), flush=True)


if __name__ == "__main__":
  main()
