"""The example backend as a user meets it: installed by pip, found through the `uopc.backends` entry point, chosen with
UOPC_DEVICE=INTERP, and running Tensor code (elementwise math, reductions, movement, a matmul, a training step under
uopc.jit) whose results match NumPy's. Run with UOPC_DEVICE=INTERP (the nox session `example_backend` sets it)."""
import importlib.metadata
import numpy as np
import pytest
from uopc import nn
from uopc.backends import available_backends, get_backend
from uopc.jit import jit
from uopc.tensor import Tensor
from uopc_example_backend import InterpreterBackend

rng = np.random.default_rng(0)


def interp() -> InterpreterBackend: return get_backend("INTERP")


@pytest.fixture
def launches():
  """How many programs INTERP runs inside the test: every test checks that its work really ran there."""
  before = interp().launches
  yield lambda: interp().launches - before


def test_the_entry_point_declares_the_backend_and_get_backend_loads_it():
  eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="uopc.backends")}
  assert eps.get("INTERP") == "uopc_example_backend:InterpreterBackend"
  assert "INTERP" in available_backends()
  assert type(get_backend("interp")) is InterpreterBackend and get_backend("INTERP") is get_backend("interp")   # one per process


def test_uopc_device_selects_the_backend():
  assert Tensor([1.0, 2.0]).device == "INTERP", "run these tests with UOPC_DEVICE=INTERP"


def test_elementwise_math_and_comparisons_match_numpy(launches):
  a = rng.standard_normal((5, 7)).astype(np.float32)
  b = (rng.random((5, 7)) + 0.5).astype(np.float32)
  ta, tb = Tensor(a), Tensor(b)
  np.testing.assert_allclose((ta * tb + 1.5).numpy(), a * b + np.float32(1.5), rtol=1e-6)
  np.testing.assert_allclose((ta / tb - ta).numpy(), a / b - a, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tb.exp().log().numpy(), b, rtol=1e-5)
  np.testing.assert_allclose(ta.sigmoid().numpy(), 1 / (1 + np.exp(-a)), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(ta.relu().numpy(), np.maximum(a, 0))
  np.testing.assert_array_equal((ta < tb).where(ta, tb).numpy(), np.where(a < b, a, b))
  i = rng.integers(-50, 50, 12).astype(np.int32)
  np.testing.assert_array_equal((Tensor(i) // 7 + Tensor(i) % 5).numpy(), i // 7 + i % 5)
  assert launches() >= 7


def test_reductions_and_movement_match_numpy(launches):
  a = rng.standard_normal((4, 6, 3)).astype(np.float32)
  t = Tensor(a)
  np.testing.assert_allclose(t.sum(1).numpy(), a.sum(1), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(t.max(axis=(0, 2)).numpy(), a.max(axis=(0, 2)))
  np.testing.assert_allclose(t.mean().numpy(), a.mean(), rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(t.permute(2, 0, 1).reshape(3, 24).numpy(), a.transpose(2, 0, 1).reshape(3, 24))
  np.testing.assert_array_equal(t[1:, ::2, 1].numpy(), a[1:, ::2, 1])
  np.testing.assert_allclose(t.softmax(-1).numpy(), np.exp(a) / np.exp(a).sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)
  assert launches() >= 6


def test_matmul_matches_numpy(launches):
  a = rng.standard_normal((12, 16)).astype(np.float32)
  b = rng.standard_normal((16, 8)).astype(np.float32)
  np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-5, atol=1e-5)
  assert launches() >= 1


def numpy_step(x, y, w1, b1, w2, b2, lr):
  """The same step in NumPy: a 2-layer ReLU MLP, mean cross-entropy, its gradients by hand, and plain SGD."""
  h_pre = x @ w1.T + b1
  h = np.maximum(h_pre, 0)
  logits = h @ w2.T + b2
  z = logits - logits.max(1, keepdims=True)
  p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
  loss = -np.log(p[np.arange(len(y)), y]).mean()
  d_logits = (p - np.eye(logits.shape[1])[y]) / len(y)
  d_h = (d_logits @ w2) * (h_pre > 0)
  grads = (d_h.T @ x, d_h.sum(0), d_logits.T @ h, d_logits.sum(0))
  return loss, [w - lr * g for w, g in zip((w1, b1, w2, b2), grads)]


def test_a_training_step_under_jit_matches_numpy(launches):
  x = rng.standard_normal((16, 4)).astype(np.float32)
  y = rng.integers(0, 3, 16).astype(np.int32)
  weights = [rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((8, 4), (8,), (3, 8), (3,))]
  params = [Tensor(w, requires_grad=True) for w in weights]
  opt = nn.SGD(params, lr=0.1)
  body_runs = []

  @jit
  def step(x, y):
    body_runs.append(1)
    opt.zero_grad()
    w1, b1, w2, b2 = params
    loss = x.linear(w1, b1).relu().linear(w2, b2).cross_entropy(y)
    loss.backward()
    opt.step()
    return loss

  expected = [w.astype(np.float64) for w in weights]
  for i in range(4):
    loss = step(Tensor(x), Tensor(y))
    want, expected = numpy_step(x.astype(np.float64), y, *expected, lr=0.1)
    np.testing.assert_allclose(loss.item(), want, rtol=1e-5, err_msg=f"loss of step {i}")
  for p, w in zip(params, expected): np.testing.assert_allclose(p.numpy(), w, rtol=1e-4, atol=1e-5)
  assert len(body_runs) == 2, "the first call runs the body, the second captures it, the others replay without it"
  assert launches() > 0
