"""Fusion: how many kernels common computations take, and that no kernel recomputes a reduction per output element."""
import numpy as np
import pytest
from uopc.uop import Ops, prod
from uopc.rangeify import lower
from uopc.linearize import linearize
from uopc.tensor import Tensor
from uopc import nn


def rand(*shape, grad=False): return Tensor(np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32), requires_grad=grad)


def work_bound_holds(kernels) -> bool:
  """Every STORE of every kernel runs at most (output elements) x (the largest reduction of that kernel) times: a
  reduction recomputed inside an output loop it doesn't use would multiply that by the loop's size. A STORE runs once
  per iteration of the loops open around it in the linearized program (sibling reductions don't multiply)."""
  for k in kernels:
    limit = (prod(k.root.shape) or 1) * max([prod(u.src[0].shape[len(u.src[0].shape) - u.arg[1]:]) for u in k.root.toposort()
                                            if u.op is Ops.REDUCE], default=1)
    trips = [1]
    for u in linearize(lower(k.canonical_root, k.canonical_out)):
      if u.op is Ops.RANGE: trips.append(trips[-1] * u.src[0].arg)
      elif u.op is Ops.END: trips.pop()
      elif u.op is Ops.STORE and trips[-1] > limit: return False
  return True


def test_an_elementwise_chain_is_one_kernel():
  x, y = rand(16, 16), rand(16)
  out = ((x * 2 + y).relu().exp() - x.sigmoid()) / 3
  assert len(out.schedule()) == 1


def test_softmax_is_at_most_three_kernels():
  ks = rand(32, 64).softmax(-1).schedule()
  assert len(ks) <= 3 and work_bound_holds(ks)


def test_matmul_bias_relu_is_at_most_two_kernels():
  x, w, b = rand(8, 16), rand(16, 4), rand(4)
  ks = (x @ w + b).relu().schedule()
  assert len(ks) <= 2 and work_bound_holds(ks)


def test_layernorm_is_at_most_three_kernels():
  ks = rand(16, 32).layernorm().schedule()
  assert len(ks) <= 3 and work_bound_holds(ks)


def test_attention_never_recomputes_a_reduction():
  q, k, v = rand(64, 16), rand(64, 16), rand(64, 16)
  ks = ((q @ k.T) * 0.25).softmax(-1).__matmul__(v).schedule()
  assert work_bound_holds(ks) and len(ks) <= 5


def test_mlp_training_step_never_recomputes_a_reduction():
  x, y = rand(32, 8), Tensor(np.arange(32, dtype=np.int32) % 3)
  l1, l2 = nn.Linear(8, 16), nn.Linear(16, 3)
  opt = nn.SGD([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.1)
  loss = l2(l1(x).relu()).cross_entropy(y)
  loss.backward()
  updates = [p - 0.1 * p.grad for p in opt.params]
  ks = updates[0].schedule(*updates[1:])
  assert work_bound_holds(ks)


def test_realized_values_are_not_recomputed():
  x = rand(8, 8)
  s = x.sum(1).realize()
  assert len((s * 2).schedule()) == 1 and s.schedule() == []


@pytest.mark.parametrize("n", [1, 3])
def test_one_kernel_structure_compiles_once(n):
  """Kernels with the same structure (different buffers) share one compiled program."""
  from uopc.runtime import _programs
  a = rand(5, 7)
  (a * 3 + n).realize()
  before = len(_programs)
  (rand(5, 7) * 3 + n).realize()
  assert len(_programs) == before


def test_a_concatenation_with_one_input_read_transposed_is_vectorized_and_matches_numpy():
  """The gradient of qkv.split(3) is the concatenation of q's, k's and v's gradients, k's arriving transposed (the
  matmul's product layout). Its one kernel read all three inputs for every output behind selects, a scalar loop (4
  GFLOP/s, 1.5 ms of a 26 ms GPT step): q and v are contiguous along the output's last axis, so it gets vector lanes
  there (k's lanes a gather), and the selects, whose conditions are the same for the 16 lanes of an aligned vector
  (uopc.symbolic takes the lane out of their // and %), are one per vector."""
  from uopc.runtime import backend_caps
  from uopc.backends import get_backend
  from uopc.opt import choose_opts
  rng = np.random.default_rng(0)
  q, kt, v = (rng.standard_normal(s, dtype=np.float32) for s in ((4, 8, 32), (4, 32, 8), (4, 8, 32)))
  out = Tensor(q).cat(Tensor(kt).transpose(1, 2), Tensor(v), dim=2)
  [kernel] = out.schedule()
  caps = backend_caps(get_backend("C"))
  if caps.vector_width > 1: assert choose_opts(kernel, caps).vector == (2, min(16, caps.vector_width))
  np.testing.assert_array_equal(out.numpy(), np.concatenate([q, kt.transpose(0, 2, 1), v], axis=2))
