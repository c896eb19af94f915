"""Tensor speed: forward+backward steps on the C backend, beside the same forward in NumPy measured in the same run.

    python benchmarks/tensor.py [--steps 5]

  mlp        2-layer MLP, batch 256, 784-256-10, cross-entropy: loss and the four parameter gradients
  attention  softmax(Q K^T / 8) V at N=512, d=64: the output and the gradients of Q, K and V
  gpt        a whole training step of uopc.gpt (vocab 65, context 64, batch 16, 2 layers, width 128, 4 heads, AdamW:
             421,632 parameters): forward, backward and the optimizer step, and the largest buffer a kernel writes
For each: the first step (it compiles the kernels), the best later step in ms, the kernels per step, and NumPy's forward
(none for the GPT; benchmarks/gpt.py puts it beside PyTorch).
"""
from __future__ import annotations
import argparse, time
import numpy as np
from uopc.tensor import Tensor


def timed(fn, steps: int) -> tuple[float, float, object]:
  t = time.perf_counter()
  out = fn()
  first = time.perf_counter() - t
  best = float("inf")
  for _ in range(steps):
    t = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t)
  return first, best, out


def mlp_case(rng):
  X = rng.standard_normal((256, 784)).astype(np.float32)
  Y = rng.integers(0, 10, 256).astype(np.int32)
  W1 = (rng.standard_normal((784, 256)) / 28).astype(np.float32)
  b1 = np.zeros(256, np.float32)
  W2 = (rng.standard_normal((256, 10)) / 16).astype(np.float32)
  b2 = np.zeros(10, np.float32)
  params = [Tensor(a, requires_grad=True) for a in (W1, b1, W2, b2)]
  x, y = Tensor(X), Tensor(Y)

  def step(count: bool = False):
    for p in params: p.grad = None
    loss = ((x @ params[0] + params[1]).relu() @ params[2] + params[3]).cross_entropy(y)
    loss.backward()
    grads = [p.grad for p in params]
    if count: return len(loss.schedule(*grads))
    Tensor.realize(loss, *grads)

  def numpy_forward():
    h = np.maximum(X @ W1 + b1, 0) @ W2 + b2
    h = h - h.max(1, keepdims=True)
    return -(h[np.arange(256), Y] - np.log(np.exp(h).sum(1))).mean()
  return step, numpy_forward


def attention_case(rng):
  Q, K, V = (rng.standard_normal((512, 64)).astype(np.float32) for _ in range(3))
  q, k, v = (Tensor(a, requires_grad=True) for a in (Q, K, V))
  R = rng.standard_normal((512, 64)).astype(np.float32)
  r = Tensor(R)

  def step(count: bool = False):
    for t in (q, k, v): t.grad = None
    out = ((q @ k.T) / 8).softmax(-1) @ v
    (out * r).sum().backward()
    if count: return len(out.schedule(q.grad, k.grad, v.grad))
    Tensor.realize(out, q.grad, k.grad, v.grad)

  def numpy_forward():
    s = Q @ K.T / 8
    e = np.exp(s - s.max(1, keepdims=True))
    return (e / e.sum(1, keepdims=True)) @ V
  return step, numpy_forward


def gpt_case(rng):
  from uopc import nn
  from uopc.gpt import GPT, GPTConfig
  Tensor.manual_seed(0)
  model = GPT(GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4))
  opt = nn.AdamW(model.parameters(), lr=1e-3)
  tokens = Tensor(rng.integers(0, 65, (16, 64)).astype(np.int32))
  targets = Tensor(rng.integers(0, 65, (16, 64)).astype(np.int32))

  def step(count: bool = False):
    opt.zero_grad()
    loss = model.loss(tokens, targets)
    loss.backward()
    updates = opt.update()
    if count:     # a real step too, so it runs after the timed ones
      kernels = loss.schedule(*updates)
      largest = max(k.out.shape[0] for k in kernels)
      loss.realize(*updates)
      return f"{len(kernels)} (largest write {largest:,} elements)"
    loss.realize(*updates)
    return loss.item()
  return step, None


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--gpt-steps", type=int, default=3, help="timed GPT steps after the first (each takes seconds until the optimizer lands)")
  args = ap.parse_args()
  rng = np.random.default_rng(0)
  print(f"{'case':<10} {'first step s':>13} {'ms/step':>9} {'kernels':>8} {'numpy fwd ms':>13} {'step/numpy fwd':>15}")
  for name, make in (("mlp", mlp_case), ("attention", attention_case), ("gpt", gpt_case)):
    step, ref = make(rng)
    first, best, _ = timed(step, args.steps if name != "gpt" else args.gpt_steps)
    kernels = step(count=True)
    if ref is None:
      print(f"{name:<10} {first:>13.2f} {best * 1e3:>9.1f} {kernels:>8} {'-':>13} {'-':>15}")
      continue
    _, np_best, _ = timed(ref, args.steps)
    print(f"{name:<10} {first:>13.2f} {best * 1e3:>9.1f} {kernels:>8} {np_best * 1e3:>13.2f} {best / np_best:>14.1f}x")


if __name__ == "__main__":
  main()
