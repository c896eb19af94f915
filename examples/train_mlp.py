"""Train a small MLP on three Gaussian blobs with uopc's Tensor on the C backend, printing the loss as it falls.

    python examples/train_mlp.py
"""
import time
import numpy as np
from uopc.tensor import Tensor
from uopc import nn

rng = np.random.default_rng(0)
centers = np.array([[2, 0], [-1, 1.7], [-1, -1.7]], np.float32)
labels = rng.integers(0, 3, 512).astype(np.int32)
points = (centers[labels] + 0.5 * rng.standard_normal((512, 2))).astype(np.float32)

Tensor.manual_seed(0)
l1, l2 = nn.Linear(2, 32), nn.Linear(32, 3)
opt = nn.Adam([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.02)
x, y = Tensor(points), Tensor(labels)
t0 = time.perf_counter()
for step in range(61):
  opt.zero_grad()
  logits = l2(l1(x).relu())
  loss = logits.cross_entropy(y)
  loss.backward()
  opt.step()
  if step % 10 == 0:
    acc = (logits.argmax(1).numpy() == labels).mean()
    print(f"step {step:3d}  loss {loss.item():.4f}  accuracy {acc:.1%}  ({time.perf_counter() - t0:.1f} s)")
