"""Every kernel stores its whole output before anything reads it. The C backend relies on it: the memory it hands out
is not zeroed (uopc.backends.c._aligned), as a buffer from its pool holds its last owner's values. Here each program
runs twice on fresh memory only (no pool), once filled with zero bytes and once with 0xFF bytes (NaN for floats, -1
for integers): an element some kernel read before any kernel wrote it would differ between the two runs."""
import numpy as np
import pytest
import uopc.backends.c as cbackend
from uopc.backends import get_backend
from uopc.jit import jit
from uopc.tensor import Tensor
from uopc import nn

RNG = np.random.default_rng(11)


def _data(*shape) -> np.ndarray: return RNG.standard_normal(shape).astype(np.float32)


X, W, B, IMG, KER = _data(6, 24), _data(24, 40), _data(40), _data(2, 3, 9, 8), _data(4, 3, 3, 3)
Q, K, V = _data(2, 3, 7, 8), _data(2, 3, 7, 8), _data(2, 3, 7, 8)
TOK, TGT = RNG.integers(0, 11, (3, 5)).astype(np.int32), RNG.integers(0, 11, (3, 5)).astype(np.int32)
EMB, HEAD = _data(11, 6), _data(6, 11)


def gemm_chain():
  return [((Tensor(X) @ Tensor(W) + Tensor(B)).relu() @ Tensor(W).T).numpy()]


def convolutions():
  x, w = Tensor(IMG), Tensor(KER)
  y = x.conv2d(w, padding=1).relu()
  return [y.max_pool2d(2).numpy(), y.avg_pool2d(3, 2, 1).numpy(), x.conv2d(w, stride=2, dilation=(1, 2)).numpy()]


def attention_and_gradients():
  q, k, v = (Tensor(a, requires_grad=True) for a in (Q, K, V))
  out = q.scaled_dot_product_attention(k, v, is_causal=True)
  (out * out).sum().backward()
  return [out.numpy(), q.grad.numpy(), k.grad.numpy(), v.grad.numpy()]


def movement_and_reductions():
  x = Tensor(IMG)
  a, b = x.split([1, 2], dim=1)
  joined = Tensor.cat(b, a * 2, b.flip(3), dim=1)
  return [joined.numpy(), x.pad((2, 1, 0, 3), mode="reflect").numpy(), Tensor.stack(a, a + 1, dim=2).numpy(),
          x.sum((0, 2)).numpy(), x.max(3).numpy(), x.argmax(2).numpy(), x.softmax(1).numpy(), x.log_softmax(-1).numpy(),
          x.cumsum(2).numpy()]


def embedding_and_loss():
  emb, head = Tensor(EMB, requires_grad=True), Tensor(HEAD, requires_grad=True)
  loss = (emb[Tensor(TOK)] @ head).reshape(-1, 11).cross_entropy(Tensor(TGT).reshape(-1))
  loss.backward()
  return [loss.numpy(), emb.grad.numpy(), head.grad.numpy()]


def training_steps():
  # a small GPT trained three jitted steps by AdamW: forward, backward and update, the JIT's buffers among the fresh
  from uopc.gpt import GPT, GPTConfig
  Tensor.manual_seed(3)
  model = GPT(GPTConfig(vocab=11, context=5, layers=1, width=16, heads=2))
  opt = nn.AdamW(model.parameters(), lr=0.01)
  @jit
  def step(tokens, targets):
    opt.zero_grad()
    loss = model.loss(tokens, targets)
    loss.backward()
    opt.step()
    return loss
  losses = [step(Tensor(TOK), Tensor((TGT + i) % 11)).numpy() for i in range(3)]
  return losses + [p.numpy() for p in model.parameters()]


PROGRAMS = [gemm_chain, convolutions, attention_and_gradients, movement_and_reductions, embedding_and_loss, training_steps]


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda f: f.__name__)
def test_no_kernel_reads_memory_no_kernel_wrote(program, monkeypatch):
  backend = get_backend("C")
  monkeypatch.setattr(type(backend), "POOL_BYTES", 0)            # every buffer fresh from _aligned
  monkeypatch.setattr(backend, "_pool", {})
  monkeypatch.setattr(backend, "_pooled", 0)
  aligned = cbackend._aligned
  runs = []
  for fill in (0x00, 0xFF):
    def filled(n, dtype, alignment=64, fill=fill):
      a = aligned(n, dtype, alignment)
      a.view(np.uint8)[...] = fill
      return a
    monkeypatch.setattr(cbackend, "_aligned", filled)
    runs.append(program())
  zeros, ones = runs
  assert len(zeros) == len(ones)
  for a, b in zip(zeros, ones):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True) and not np.isnan(a).any(), f"{program.__name__}: a kernel read unwritten memory"


def test_fresh_memory_is_aligned_and_sized(monkeypatch):
  monkeypatch.delenv("UOPC_SANITIZE", raising=False)
  for n, dtype in [(1, np.float32), (1000, np.int32), (37, np.float16)]:
    a = cbackend._aligned(n, np.dtype(dtype))
    assert a.shape == (n,) and a.dtype == dtype and a.ctypes.data % 64 == 0
