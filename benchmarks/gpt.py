"""The GPT training step and sampling in uopc beside the same model in PyTorch (eager and torch.compile).

    python benchmarks/gpt.py [--sizes default,nanogpt] [--only train,sample] [--rounds 3] [--warm-cache]

Two models: `default` (vocab 65, context 64, 2 layers, width 128, 4 heads, batch 16; 421,632 parameters) and `nanogpt`
(nanoGPT's character-level size: context 256, 6 layers, width 384, 6 heads, batch 8; about 10.8M parameters). Both
train with AdamW on character windows of this repository's README folded into 65 symbols. A third, `vocab8k`
(`--sizes vocab8k`), is the default model with a vocabulary of 8,192 tokens (2.5M parameters, the README's bytes as its
tokens): what a vocabulary costs (its embedding's gathers and gradient, its loss's pick, the logits' deep GEMMs).

Every contender runs in a process of its own (this script calls itself with --worker), one after another, so that no
thread pool spins beside another's (OpenMP, OpenBLAS and PyTorch all spin-wait a while after a parallel region, which on
two cores costs whoever runs next up to half the machine). PyTorch gets uopc's initial weights and the same batches, so
the losses after the warm-up steps should agree to a few digits.

Training rows, per contender: the first step (uopc's compile cache is a fresh directory unless --warm-cache: that step
kernelizes, chooses Opts and runs gcc for every kernel; torch.compile's first step compiles too), the loss after the
warm-up steps, the steady step (the best of --rounds rounds of steps), the process's peak memory (RSS, after the
warm-up and the rounds: about 110 steps of the default model), and the ratio of each contender's time to uopc's jitted
step (above 1: uopc is faster). `uopc` is the step under uopc.jit (what `uopc gpt train` runs); `uopc plain` is the
same step called as Tensor code each time (the graph built, scheduled and launched per step).

Sampling rows: tokens per second of greedy decoding with a key/value cache, a prompt of one token and context - 1 new
tokens, at batch 1 and 16: uopc.gpt.generate (one jitted replay per token) beside the same loop in PyTorch eager
(under no_grad, a preallocated cache written in place). The two must pick the same tokens.
"""
from __future__ import annotations
import argparse, json, os, resource, subprocess, sys, tempfile, time
from pathlib import Path
import numpy as np

SIZES = {"default": (dict(vocab=65, context=64, layers=2, width=128, heads=4), 16),
         "nanogpt": (dict(vocab=65, context=256, layers=6, width=384, heads=6), 8)}
# warm-up steps before the timed rounds and steps per round (the big model's step takes seconds)
SIZES["vocab8k"] = (dict(SIZES["default"][0], vocab=8192), 16)
SCHEDULE = {"default": (20, 30), "nanogpt": (3, 3), "vocab8k": (10, 10)}
TRAINERS = ("uopc", "uopc plain", "torch", "torch.compile")


def batches(cfg, batch: int, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
  """n (tokens, targets) batches of (batch, context) windows of the README, folded into the vocabulary."""
  text = (Path(__file__).resolve().parent.parent / "README.md").read_bytes()
  data = (np.frombuffer(text, np.uint8).astype(np.int32) % cfg.vocab)
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    starts = rng.integers(0, len(data) - cfg.context - 1, batch)
    seqs = np.stack([data[s:s + cfg.context + 1] for s in starts])
    out.append((seqs[:, :-1].copy(), seqs[:, 1:].copy()))
  return out


def peak_rss_mib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024      # Linux reports KiB


# ---- the uopc contenders -----------------------------------------------------------------------------------------------

def uopc_model(cfg_kw: dict, state_path: Path):
  """uopc's GPT from seed 0; its weights are written to state_path (an .npz) for the torch contenders to load."""
  from uopc.tensor import Tensor
  from uopc import nn
  from uopc.gpt import GPT, GPTConfig
  Tensor.manual_seed(0)
  model = GPT(GPTConfig(**cfg_kw))
  if not state_path.exists():
    np.savez(state_path, **{k: v.numpy() for k, v in nn.get_state_dict(model).items()})
  return model


def uopc_trainer(cfg_kw: dict, state_path: Path, plain: bool):
  from uopc.tensor import Tensor
  from uopc import nn
  from uopc.gpt import training_step
  model = uopc_model(cfg_kw, state_path)
  opt = nn.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
  if not plain:
    step = training_step(model, opt)
    return lambda x, y: step(Tensor(x), Tensor(y)).item()
  def plain_step(x: np.ndarray, y: np.ndarray) -> float:
    opt.zero_grad()
    loss = model.loss(Tensor(x), Tensor(y))
    loss.backward()
    opt.step()
    return loss.item()
  return plain_step


def uopc_sampler(cfg_kw: dict, state_path: Path):
  from uopc.gpt import generate
  model = uopc_model(cfg_kw, state_path)
  return lambda prompts, n: generate(model, prompts, n, temperature=0)


# ---- the PyTorch contenders --------------------------------------------------------------------------------------------

def torch_model(cfg, state_path: Path):
  """The same architecture in PyTorch, with the same parameter names as uopc.gpt's state dict, and uopc's weights."""
  import torch
  F = torch.nn.functional
  class Block(torch.nn.Module):
    def __init__(self):
      super().__init__()
      c = cfg.width
      self.ln1, self.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
      self.attn, self.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
      self.fc, self.out = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
    def heads(self, x):
      B, L, C = x.shape
      return (t.reshape(B, L, cfg.heads, C // cfg.heads).transpose(1, 2) for t in self.attn(self.ln1(x)).split(C, -1))
    def mlp(self, x): return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
    def forward(self, x):
      B, L, C = x.shape
      q, k, v = self.heads(x)
      return self.mlp(x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, C)))
    def decode(self, x, pos: int, cache):
      """x (B, 1, C) at position pos; the key and value are written into cache (K, V: (B, H, context, C/H))."""
      B, _, C = x.shape
      q, k, v = self.heads(x)
      K, V = cache
      K[:, :, pos], V[:, :, pos] = k[:, :, 0], v[:, :, 0]
      y = F.scaled_dot_product_attention(q, K[:, :, :pos + 1], V[:, :, :pos + 1])
      return self.mlp(x + self.proj(y.transpose(1, 2).reshape(B, 1, C)))
  class Model(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.wte, self.wpe = torch.nn.Embedding(cfg.vocab, cfg.width), torch.nn.Embedding(cfg.context, cfg.width)
      self.blocks = torch.nn.ModuleList([Block() for _ in range(cfg.layers)])
      self.lnf, self.head = torch.nn.LayerNorm(cfg.width), torch.nn.Linear(cfg.width, cfg.vocab, bias=False)
    def forward(self, t):
      x = self.wte(t) + self.wpe(torch.arange(t.shape[1], device=t.device))
      for b in self.blocks: x = b(x)
      return self.head(self.lnf(x))
    def decode(self, tok, pos: int, caches):
      x = self.wte(tok[:, None]) + self.wpe.weight[pos]
      for b, cache in zip(self.blocks, caches): x = b.decode(x, pos, cache)
      return self.head(self.lnf(x))[:, 0]
  model = Model()
  with np.load(state_path) as state: model.load_state_dict({k: torch.from_numpy(state[k].copy()) for k in state.files})
  return model


def torch_trainer(cfg, state_path: Path, compiled: bool, device: str = "cpu"):
  import torch
  model = torch_model(cfg, state_path).to(device)
  opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
  forward = torch.compile(model) if compiled else model
  def step(x: np.ndarray, y: np.ndarray) -> float:
    opt.zero_grad()
    logits = forward(torch.from_numpy(x).long().to(device))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), torch.from_numpy(y).long().to(device).reshape(-1))
    loss.backward()
    opt.step()
    return loss.item()
  return step


def torch_sampler(cfg, state_path: Path):
  import torch
  model = torch_model(cfg, state_path)
  @torch.no_grad()
  def sample(prompts: np.ndarray, n: int) -> np.ndarray:
    B, D = len(prompts), cfg.width // cfg.heads
    caches = [(torch.zeros(B, cfg.heads, cfg.context, D), torch.zeros(B, cfg.heads, cfg.context, D)) for _ in range(cfg.layers)]
    tok, out = torch.from_numpy(prompts[:, 0]).long(), []
    for pos in range(n):
      tok = model.decode(tok, pos, caches).argmax(-1)
      out.append(tok)
    return torch.stack(out, 1).numpy()
  return sample


# ---- a worker: one contender, one size, one task, in this process ------------------------------------------------------

def worker(args) -> dict:
  from uopc.gpt import GPTConfig
  from uopc.backends import get_backend
  cfg_kw, batch = SIZES[args.size]
  cfg = GPTConfig(**cfg_kw)
  threads = get_backend("C").caps.threads
  if args.contender.startswith("torch"):
    import torch
    torch.set_num_threads(threads)
  state = Path(args.state)
  if args.task == "sample":
    sample = uopc_sampler(cfg_kw, state) if args.contender == "uopc" else torch_sampler(cfg, state)
    prompts = (np.arange(args.batch, dtype=np.int32) % cfg.vocab)[:, None]
    n = cfg.context - 1
    tokens = sample(prompts, n)                    # compiles and captures
    best = min(timed(lambda: sample(prompts, n)) for _ in range(args.rounds))
    return {"tokens_per_s": args.batch * n / best, "tokens": np.asarray(tokens).tolist()}
  warm, per_round = SCHEDULE[args.size]
  data = batches(cfg, batch, warm + per_round)
  if args.contender.startswith("uopc"): step = uopc_trainer(cfg_kw, state, plain=args.contender == "uopc plain")
  else: step = torch_trainer(cfg, state, compiled=args.contender == "torch.compile")
  if args.first_only: return {"first": timed(lambda: step(*data[0]))}
  first, loss, best = train_timed(step, data, warm, args.rounds)
  return {"first": first, "loss": loss, "step": best, "rss": peak_rss_mib()}


def train_timed(step, data: list, warm: int, rounds: int) -> tuple[float, float, float]:
  """(the first step's seconds, the loss after `warm` steps, the best of `rounds` rounds' mean step over the rest of
  `data`) of `step(tokens, targets) -> loss` (a float: the step has finished when it returns)."""
  t = time.perf_counter()
  losses = [step(*data[0])]
  first = time.perf_counter() - t
  losses += [step(x, y) for x, y in data[1:warm]]
  best = min(timed(lambda: [step(x, y) for x, y in data[warm:]]) / (len(data) - warm) for _ in range(rounds))
  return first, losses[-1], best


def timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def run_worker(contender: str, size: str, task: str, state: Path, args, cache: str | None = None, **extra) -> dict | None:
  """This script as a worker process; its result, or None (and the reason printed) when it failed."""
  cmd = [sys.executable, __file__, "--worker", "--contender", contender, "--size", size, "--task", task,
         "--state", str(state), "--rounds", str(args.rounds)]
  for k, v in extra.items(): cmd += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
  env = dict(os.environ)
  if cache: env["UOPC_CACHE_DIR"] = cache
  p = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if p.returncode:
    print(f"  ({contender}, {size}, {task} failed: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode})")
    return None
  return json.loads(p.stdout.strip().splitlines()[-1])


def has_torch() -> bool:
  return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--sizes", default="default,nanogpt", help="comma-separated among default, nanogpt, vocab8k")
  ap.add_argument("--only", default="train,sample", help="comma-separated among train, sample")
  ap.add_argument("--contenders", default=",".join(TRAINERS), help=f"training contenders among {', '.join(TRAINERS)}")
  ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each contender (default 3)")
  ap.add_argument("--warm-cache", action="store_true", help="use $UOPC_CACHE_DIR as it is (the first step then skips gcc)")
  ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  for a in ("contender", "size", "task", "state"): ap.add_argument(f"--{a}", help=argparse.SUPPRESS)
  ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
  ap.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.worker:
    print(json.dumps(worker(args)))
    return

  from uopc.gpt import GPTConfig, parameter_count
  from uopc.backends import get_backend
  torch_ok = has_torch()
  contenders = [c for c in args.contenders.split(",") if torch_ok or not c.startswith("torch")]
  scratch = Path(tempfile.mkdtemp(prefix="uopc-bench-gpt-"))
  warm_cache = os.environ.get("UOPC_CACHE_DIR") if args.warm_cache else None
  cache = warm_cache or str(scratch / "cache")
  print(f"{get_backend('C').caps.threads} threads; every contender in its own process; "
        f"compile cache {'warm: ' + cache if warm_cache else 'cold (a fresh directory)'}; torch {'found' if torch_ok else 'not installed'}")
  for size in args.sizes.split(","):
    cfg_kw, batch = SIZES[size]
    cfg = GPTConfig(**cfg_kw)
    state = scratch / f"{size}.npz"
    warm, per_round = SCHEDULE[size]
    print(f"\n{size}: vocab {cfg.vocab}, context {cfg.context}, {cfg.layers} layers, width {cfg.width}, {cfg.heads} heads, "
          f"batch {batch}, AdamW ({parameter_count(cfg):,} parameters)")
    if "train" in args.only:
      # uopc's jitted step first: it writes the initial weights the others load, and its first step meets the cache cold
      results = {c: run_worker(c, size, "train", state, args, cache=cache) for c in ["uopc"] + [c for c in contenders if c != "uopc"]}
      base = results["uopc"] and results["uopc"]["step"]
      print(f"  {'training step':16}{'first step':>12}{'loss after ' + str(warm):>18}{'steady step':>14}{'peak RSS':>12}{'x uopc time':>13}")
      for c, r in results.items():
        if r is None: continue
        print(f"  {c:16}{r['first'] * 1e3:>9.0f} ms{r['loss']:>18.4f}{r['step'] * 1e3:>11.1f} ms{r['rss']:>8.0f} MiB"
              f"{r['step'] / base if base else float('nan'):>12.2f}x")
    if "sample" in args.only:
      print(f"  {'sampling':16}{'batch':>6}{'uopc tok/s':>14}{'torch tok/s':>14}{'uopc/torch':>12}  same tokens")
      for b in (1, 16):
        ours = run_worker("uopc", size, "sample", state, args, cache=cache, batch=b)
        theirs = run_worker("torch", size, "sample", state, args, batch=b) if torch_ok else None
        if ours is None: continue
        same = f"{np.mean(np.array(ours['tokens']) == np.array(theirs['tokens'])):.0%}" if theirs else "-"
        t_rate = f"{theirs['tokens_per_s']:>14.0f}{ours['tokens_per_s'] / theirs['tokens_per_s']:>11.2f}x" if theirs else f"{'-':>14}{'-':>12}"
        print(f"  {'':16}{b:>6}{ours['tokens_per_s']:>14.0f}{t_rate}  {same}")


if __name__ == "__main__":
  main()
