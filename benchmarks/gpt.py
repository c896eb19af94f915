"""The GPT training step under uopc.jit beside the same model in PyTorch eager, measured in the same run.

    python benchmarks/gpt.py [--steps 30] [--rounds 3] [--warm-cache]

The model: vocab 65, context 64, batch 16, 2 layers, width 128, 4 heads, AdamW (421,632 parameters). PyTorch gets
uopc's initial weights, and both see the same batches (character windows of this repository's README, folded into 65
symbols), so their losses after 20 steps should agree to a few digits.

Rows: the first step (uopc's compile cache is a fresh directory unless --warm-cache: that step kernelizes, chooses
Opts and runs gcc for every kernel; PyTorch's first eager step has no compile), the loss after 20 steps for both, and
the steady step: the best of --rounds rounds of --steps steps of each in turn (uopc's replays; the same batches), and
the ratio PyTorch / uopc (above 1: uopc is faster).
"""
from __future__ import annotations
import argparse, os, sys, tempfile, time
from pathlib import Path
import numpy as np

if "--warm-cache" not in sys.argv and "UOPC_CACHE_DIR" not in os.environ:
  os.environ["UOPC_CACHE_DIR"] = tempfile.mkdtemp(prefix="uopc-bench-cache-")
from uopc.tensor import Tensor                     # noqa: E402
from uopc import nn                                # noqa: E402
from uopc.gpt import GPT, GPTConfig, parameter_count, training_step   # noqa: E402
from uopc.backends import get_backend              # noqa: E402

try:
  import torch
  torch.set_num_threads(get_backend("C").caps.threads)
except ImportError: torch = None

CFG = GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4)
BATCH = 16


def batches(n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
  """n (tokens, targets) batches of (BATCH, context) windows of the README, folded into the vocabulary."""
  text = (Path(__file__).resolve().parent.parent / "README.md").read_bytes()
  data = (np.frombuffer(text, np.uint8) % CFG.vocab).astype(np.int32)
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    starts = rng.integers(0, len(data) - CFG.context - 1, BATCH)
    seqs = np.stack([data[s:s + CFG.context + 1] for s in starts])
    out.append((seqs[:, :-1].copy(), seqs[:, 1:].copy()))
  return out


def uopc_trainer():
  Tensor.manual_seed(0)
  model = GPT(CFG)
  opt = nn.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
  step = training_step(model, opt)
  return model, lambda x, y: step(Tensor(x), Tensor(y)).item()


def torch_model(cfg: GPTConfig):
  """The same architecture in PyTorch, with the same parameter names as uopc.gpt's state dict."""
  F = torch.nn.functional
  class Block(torch.nn.Module):
    def __init__(self):
      super().__init__()
      c = cfg.width
      self.ln1, self.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
      self.attn, self.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
      self.fc, self.out = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)
    def forward(self, x):
      B, L, C = x.shape
      q, k, v = (t.reshape(B, L, cfg.heads, C // cfg.heads).transpose(1, 2) for t in self.attn(self.ln1(x)).split(C, -1))
      x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, C))
      return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
  class Model(torch.nn.Module):
    def __init__(self):
      super().__init__()
      self.wte, self.wpe = torch.nn.Embedding(cfg.vocab, cfg.width), torch.nn.Embedding(cfg.context, cfg.width)
      self.blocks = torch.nn.ModuleList([Block() for _ in range(cfg.layers)])
      self.lnf, self.head = torch.nn.LayerNorm(cfg.width), torch.nn.Linear(cfg.width, cfg.vocab, bias=False)
    def forward(self, t):
      x = self.wte(t) + self.wpe(torch.arange(t.shape[1]))
      for b in self.blocks: x = b(x)
      return self.head(self.lnf(x))
  return Model()


def torch_trainer(state: dict[str, np.ndarray] | None = None):
  """A training step of the torch model (from `state`, uopc's weights, when given) on numpy batches."""
  torch.manual_seed(0)
  model = torch_model(CFG)
  if state is not None: model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
  opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
  def step(x: np.ndarray, y: np.ndarray) -> float:
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x).long()).reshape(-1, CFG.vocab), torch.from_numpy(y).long().reshape(-1))
    loss.backward()
    opt.step()
    return loss.item()
  return step


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=30, help="steps per timed round (default 30)")
  ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each contender, alternating (default 3)")
  ap.add_argument("--warm-cache", action="store_true", help="use $UOPC_CACHE_DIR as it is (the first step then skips gcc)")
  args = ap.parse_args()
  data = batches(20 + args.steps)
  print(f"GPT step: vocab {CFG.vocab}, context {CFG.context}, batch {BATCH}, {CFG.layers} layers, width {CFG.width}, "
        f"{CFG.heads} heads, AdamW ({parameter_count(CFG):,} parameters); {get_backend('C').caps.threads} threads")

  model, ours = uopc_trainer()
  state = {k: v.numpy().copy() for k, v in nn.get_state_dict(model).items()}
  t = time.perf_counter()
  losses = [ours(*data[0])]
  first = time.perf_counter() - t
  losses += [ours(x, y) for x, y in data[1:20]]
  theirs = torch_trainer(state) if torch else None
  if theirs:
    t = time.perf_counter()
    t_losses = [theirs(*data[0])]
    t_first = time.perf_counter() - t
    t_losses += [theirs(x, y) for x, y in data[1:20]]

  best = {"uopc": float("inf"), "torch": float("inf")}
  for _ in range(args.rounds):
    for name, fn in (("uopc", ours), ("torch", theirs)):
      if fn is None: continue
      t = time.perf_counter()
      for x, y in data[20:]: fn(x, y)
      best[name] = min(best[name], (time.perf_counter() - t) / args.steps)

  cache = "warm" if args.warm_cache else "cold"
  print(f"{'':24}{'uopc (jit)':>14}{'torch eager':>14}{'torch/uopc':>12}")
  def row(label: str, a: float, b: float | None, fmt: str, ratio: bool = True):
    cells = f"{label:24}{fmt.format(a):>14}" + (f"{fmt.format(b):>14}" if b is not None else f"{'-':>14}")
    print(cells + (f"{b / a:>11.2f}x" if ratio and b is not None else ""))
  row(f"first step ({cache} cache)", first * 1e3, t_first * 1e3 if theirs else None, "{:.0f} ms", ratio=False)
  row("loss after 20 steps", losses[-1], t_losses[-1] if theirs else None, "{:.4f}", ratio=False)
  row("steady step", best["uopc"] * 1e3, best["torch"] * 1e3 if theirs else None, "{:.2f} ms")


if __name__ == "__main__":
  main()
