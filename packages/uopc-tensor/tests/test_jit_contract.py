"""uopc.jit's contract, case by case: a replay computes what calling the function now would compute (or refuses). Each
test is a training-loop idiom a user brought from PyTorch or tinygrad that once gave a wrong number without a word; each
runs the jitted function beside the same function called plainly, from the same state, and compares every value."""
import subprocess, sys, textwrap
import numpy as np
import pytest
from uopc.tensor import Tensor
from uopc.jit import jit, JitError
from uopc import nn


def data(seed: int, *shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def ones(*shape, v=1.0): return Tensor(np.full(shape, v, np.float32))


def close(a, b):
  """Equal up to the order of additions: a captured call realizes its loss, gradients and updates in one schedule, which
  may fuse (and so round) a little differently from the plain call's separate ones."""
  np.testing.assert_allclose(a.numpy() if isinstance(a, Tensor) else a, b.numpy() if isinstance(b, Tensor) else b, rtol=1e-5, atol=1e-6)


# ---- 1. inputs that alias ---------------------------------------------------------------------------------------------

def test_the_same_tensor_passed_twice_then_two_tensors():
  f = jit(lambda a, b: (a + b * 2).sum())
  x = ones(3)
  assert f(x, x).item() == 9 and f(x, x).item() == 9
  assert f(ones(3), ones(3, v=2.0)).item() == 15            # the capture read one buffer for both: 18 before
  assert f(x, x).item() == 9                                # and the aliased case still replays its own capture
  assert f(ones(3, v=2.0), ones(3)).item() == 12


def test_arguments_returned_after_a_capture_of_the_same_tensor_twice_are_the_calls_own():
  """A function that returns its arguments (and computes nothing it keeps), captured with one tensor passed twice: a
  call with two tensors is another capture, and each returned tensor is the one passed in its place (the replay of the
  first capture returned the second argument for both: the long fuzzer's loop 2050158510)."""
  def f(x, aux, y):
    (x + aux - y).square().mean()           # (dead: nothing realizes it)
    return aux, x
  g = jit(f)
  a, b, y = Tensor(data(1, 3)), Tensor(data(2, 3)), Tensor(data(3, 3))
  g(a, a, y)
  g(a, a, y)                                # captured: x and aux are one tensor
  for k in range(3):
    x, aux = Tensor(data(10 + k, 3)), Tensor(data(20 + k, 3))
    got_aux, got_x = g(x, aux, y)
    assert got_x is x and got_aux is aux
  got_aux, got_x = g(b, b, y)
  assert got_x is b and got_aux is b


def test_two_tensors_then_the_same_tensor_twice():
  f = jit(lambda a, b: (a * b).sum())
  for k in range(3): f(Tensor(data(k, 4)), Tensor(data(k + 5, 4)))
  x = Tensor(data(9, 4))
  np.testing.assert_allclose(f(x, x).item(), (data(9, 4) ** 2).sum(), rtol=1e-6)


def lstm_cell(x, h, c, w):
  z = (x + h) @ w
  c2 = z.sigmoid() * c + z.tanh()
  return c2.tanh(), c2


def test_equal_constants_as_an_lstm_initial_state_stay_two_tensors():
  w = Tensor(data(0, 3, 3))
  cell = jit(lambda x, h, c: lstm_cell(x, h, c, w))
  for k in range(5):                                        # captured on the second sequence's first step, with zeros
    h, c = Tensor.zeros(3), Tensor.zeros(3)               # one hash-consed graph: once realized into one buffer
    h_want, c_want = np.zeros(3, np.float32), np.zeros(3, np.float32)
    for t in range(1 if k < 2 else 3):
      x = Tensor(data(10 * k + t, 3))
      h_want, c_want = (v.numpy() for v in lstm_cell(x, Tensor(h_want), Tensor(c_want), w))
      h, c = cell(x, h, c)
      np.testing.assert_allclose(h.numpy(), h_want, rtol=1e-6)
      np.testing.assert_allclose(c.numpy(), c_want, rtol=1e-6)


def test_an_argument_that_is_also_state_the_function_reads():
  w = Tensor(data(1, 4)).realize()
  f = jit(lambda a: (a * w).sum())
  for k in range(3): f(Tensor(data(k, 4)))
  np.testing.assert_allclose(f(w).item(), (data(1, 4) ** 2).sum(), rtol=1e-6)   # a and w are one buffer now
  np.testing.assert_allclose(f(Tensor(data(7, 4))).item(), (data(7, 4) * data(1, 4)).sum(), rtol=1e-6)


# ---- 2. state read from its current buffer ----------------------------------------------------------------------------

def test_an_assign_outside_after_the_capture_is_seen():
  w = ones(3).realize()
  f = jit(lambda x: (x * w).sum())
  x = ones(3)
  assert [f(x).item() for _ in range(3)] == [3, 3, 3]
  w.assign(ones(3, v=2.0))                                  # realized
  assert f(x).item() == 6                                   # 3 before: the replay read the captured buffer
  w.assign(w * 5)                                           # left lazy
  assert f(x).item() == 30


def sgd_model(seed: int):
  Tensor.manual_seed(seed)
  lin = nn.Linear(3, 2)
  opt = nn.SGD([lin.weight, lin.bias], lr=0.1, momentum=0.9)
  def step(x, y):
    opt.zero_grad()
    loss = (lin(x) - y).square().mean()
    loss.backward()
    opt.step()
    return loss
  return lin, step


def batch(seed: int, n: int): return Tensor(data(seed, n, 3)), Tensor(data(seed + 100, n, 2))


def test_two_jitted_functions_share_parameters_and_an_eager_step_comes_between():
  lin, step = sgd_model(0)
  twin, plain = sgd_model(0)
  by_shape = {16: jit(step), 8: jit(step)}                 # one per batch shape, as a user writes for the last batch
  for k in range(12):
    n = 16 if k % 3 else 8
    fn = step if k % 5 == 4 else by_shape[n]               # and sometimes a plain step in between
    close(fn(*batch(k, n)), plain(*batch(k, n)))
    for p, q in zip(nn.get_state_dict(lin).values(), nn.get_state_dict(twin).values()): close(p, q)


def test_load_state_dict_and_the_learning_rate_between_replays_are_seen():
  lin, step = sgd_model(1)
  twin, plain = sgd_model(1)
  fast = jit(step)
  for k in range(8):
    if k == 4:
      fresh = {name: data(50 + i, *t.shape) for i, (name, t) in enumerate(nn.get_state_dict(lin).items())}
      nn.load_state_dict(lin, fresh)
      nn.load_state_dict(twin, fresh)
    close(fast(*batch(k, 8)), plain(*batch(k, 8)))
  close(lin.weight, twin.weight)


# ---- 3. what the function makes visible -------------------------------------------------------------------------------

def accumulator(seed: int):
  Tensor.manual_seed(seed)
  lin = nn.Linear(3, 2)
  opt = nn.Adam([lin.weight, lin.bias], lr=0.05)
  def forward_backward(x, y):
    loss = (lin(x) - y).square().mean()
    loss.backward()
    return loss
  return lin, opt, forward_backward


def test_gradient_accumulation_backward_inside_step_outside():
  lin, opt, fb = accumulator(2)
  twin, twin_opt, plain = accumulator(2)
  fast = jit(fb)
  for k in range(13):
    close(fast(*batch(k, 8)), plain(*batch(k, 8)))
    close(lin.weight.grad, twin.weight.grad)               # .grad holds the replay's sum (None after the capture before)
    if k % 4 == 3:
      opt.step(), twin_opt.step()
      opt.zero_grad(), twin_opt.zero_grad()
  close(lin.weight, twin.weight)
  assert not np.array_equal(lin.weight.numpy(), accumulator(2)[0].weight.numpy())    # it trained


def test_returned_tensors_keep_their_values_across_calls():
  f = jit(lambda x: (x * 2, x.sum()))
  kept = [f(Tensor(data(k, 5))) for k in range(6)]        # a list of losses, read at the end of training
  for k, (doubled, total) in enumerate(kept):
    np.testing.assert_array_equal(doubled.numpy(), data(k, 5) * 2)
    np.testing.assert_allclose(total.item(), data(k, 5).sum(), rtol=1e-6)


def test_a_tensor_the_function_stores_elsewhere_holds_the_replays_value():
  class Model: pass
  m = Model()
  w = Tensor(data(0, 4))
  def fn(x):
    m.last = (x * w).relu()
    return m.last.sum()
  f = jit(fn)
  for k in range(4):
    total = f(Tensor(data(k, 4)))
    want = np.maximum(data(k, 4) * data(0, 4), 0)
    np.testing.assert_array_equal(m.last.numpy(), want)
    np.testing.assert_allclose(total.item(), want.sum(), rtol=1e-6)


def test_a_replay_output_has_no_graph_and_says_so():
  w = Tensor(data(0, 3), requires_grad=True)
  f = jit(lambda x: (x * w).sum())
  for k in range(3): loss = f(Tensor(data(k, 3)))
  with pytest.raises(Exception, match="uopc.jit replay"): loss.backward()


# ---- 4. arguments ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["list", "array"])
def test_a_mutable_argument_changed_in_place_is_compared_by_value(kind):
  scale = [1.0, 2.0] if kind == "list" else np.array([1.0, 2.0])
  f = jit(lambda x, s: x * float(s[0]) + float(s[1]))
  x = ones(2)
  for _ in range(3): assert f(x, scale).numpy().tolist() == [3.0, 3.0]
  scale[0] = 5.0                                            # in place: the same object, another value
  with pytest.raises(JitError, match="other arguments differ"): f(x, scale)
  scale[0] = 1.0
  assert f(x, scale).numpy().tolist() == [3.0, 3.0]


def test_zero_dimensional_empty_and_dict_arguments():
  f = jit(lambda x: x * 2)
  assert [f(Tensor(np.float32(k))).item() for k in range(4)] == [0, 2, 4, 6]
  g = jit(lambda x, y: (x * 2, y + 1))
  for k in range(4):
    e, y = g(Tensor(np.zeros((0, 3), np.float32)), Tensor(data(k, 2)))
    assert e.shape == (0, 3)
    np.testing.assert_array_equal(y.numpy(), data(k, 2) + 1)
  h = jit(lambda d: d["a"] * d["b"])
  for k in range(4): np.testing.assert_array_equal(h({"b": Tensor(data(k, 2)), "a": ones(2, v=k)}).numpy(), data(k, 2) * k)


# ---- 5. random numbers in a step ---------------------------------------------------------------------------------------

def test_a_gpt_training_step_with_dropout_replays_what_a_plain_step_computes():
  from uopc.gpt import GPT, GPTConfig, training_step
  cfg = GPTConfig(vocab=11, context=8, layers=1, width=16, heads=2, dropout=0.1)
  def make():
    Tensor.manual_seed(0)
    model = GPT(cfg)
    return model, nn.AdamW(nn.get_parameters(model) if hasattr(nn, "get_parameters") else list(nn.get_state_dict(model).values()), lr=1e-2)
  model, opt = make()
  twin, twin_opt = make()
  fast = training_step(model, opt)
  plain = training_step(twin, twin_opt).__wrapped__
  rng = np.random.default_rng(0)
  for k in range(5):
    x = rng.integers(0, cfg.vocab, (4, cfg.context)).astype(np.int32)
    Tensor.manual_seed(100 + k)
    a = fast(Tensor(x), Tensor(np.roll(x, -1, 1))).item()
    Tensor.manual_seed(100 + k)
    b = plain(Tensor(x), Tensor(np.roll(x, -1, 1))).item()
    assert a == b, (k, a, b)
  for p, q in zip(nn.get_state_dict(model).values(), nn.get_state_dict(twin).values()): np.testing.assert_array_equal(p.numpy(), q.numpy())


# ---- 6. threads (each in a subprocess: a race is the whole interpreter's) ---------------------------------------------

def run_child(code: str) -> None:
  r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout + r.stderr


def test_another_threads_item_and_assign_are_not_part_of_a_capture():
  run_child("""
    import threading
    import numpy as np
    from uopc.tensor import Tensor
    from uopc.jit import jit
    inside, done = threading.Event(), threading.Event()
    other = Tensor(np.ones(3, np.float32)).realize()
    def fn(x):
      y = x * 2
      if f.calls == 2:                 # the capturing call: let the other thread work meanwhile
        inside.set()
        assert done.wait(60)
      return y
    f = jit(fn)
    errors = []
    def worker():
      assert inside.wait(60)
      try:
        assert Tensor(np.arange(3, dtype=np.float32)).sum().item() == 3   # refused as "inside a capture" before
        other.assign(other + 1).realize()                                 # captured into the other thread's replays before
      except Exception as e: errors.append(e)
      done.set()
    t = threading.Thread(target=worker); t.start()
    for k in range(4): f(Tensor(np.full(3, k, np.float32)))
    t.join()
    assert not errors, errors
    assert other.numpy().tolist() == [2.0, 2.0, 2.0], other.numpy()       # the replays left it alone
  """)


def test_one_jitted_function_called_from_three_threads_returns_each_callers_value():
  run_child("""
    import sys, threading
    import numpy as np
    from uopc.tensor import Tensor
    from uopc.jit import jit
    sys.setswitchinterval(1e-6)
    w = Tensor(np.arange(64, dtype=np.float32)).realize()
    f = jit(lambda x: (x * w + 1).sum(0))
    wrong, start = [], threading.Barrier(3)
    def worker(k):
      start.wait()
      for i in range(300):
        v = float(100 * k + i)
        got = f(Tensor(np.full((4, 64), v, np.float32))).numpy()
        if not np.array_equal(got, 4 * (v * np.arange(64, dtype=np.float32) + 1)): wrong.append((k, i))
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
    for t in ts: t.start()
    for t in ts: t.join()
    assert not wrong, f"{len(wrong)} calls returned another caller's value: {wrong[:5]}"
  """)


# ---- 7. buffers are shared only when the user shares them ------------------------------------------------------------

def test_tensors_realized_together_from_one_graph_are_two_buffers():
  class M: pass
  m = M()
  m.b1, m.b2 = Tensor.zeros(3), Tensor.zeros(3)
  m.b1.realize(m.b2)                                        # tinygrad's realize-the-parameters idiom
  nn.load_state_dict(m, {"b1": np.ones(3, np.float32), "b2": np.full(3, 2, np.float32)})
  assert m.b1.numpy().tolist() == [1, 1, 1] and m.b2.numpy().tolist() == [2, 2, 2]
  c, d = Tensor.zeros(1), Tensor.zeros(1)
  c.realize(d)
  c.requires_grad_(), d.requires_grad_()
  opt = nn.SGD([c, d], lr=1.0)
  (c * 1 + d * 2).sum().backward()
  opt.step()
  assert c.numpy().tolist() == [-1.0] and d.numpy().tolist() == [-2.0]    # both -3 when they were one leaf


# ---- 12. detach ------------------------------------------------------------------------------------------------------

def test_detach_needs_no_gradient_and_keeps_no_graph():
  import gc, weakref
  w = Tensor(data(0, 64, 64), requires_grad=True)
  x = Tensor(data(1, 8, 64))
  loss = (x @ w).relu().sum()
  d = loss.detach()
  assert d.requires_grad is False and loss.requires_grad is True
  with pytest.raises(Exception, match="nothing in this graph requires a gradient"): d.backward()
  np.testing.assert_allclose(d.item(), np.maximum(data(1, 8, 64) @ data(0, 64, 64), 0).sum(), rtol=1e-4)
  graph = weakref.ref(x.uop)                                # what the loss's graph holds besides the parameter
  del loss, x
  gc.collect()
  assert graph() is None, "a detached loss kept its graph alive"
  assert d.item() == d.item()


def test_detached_losses_kept_over_a_training_loop_hold_numbers_not_models():
  from uopc.tensor.storage import buffers
  lin = nn.Linear(32, 32)
  opt = nn.SGD([lin.weight, lin.bias], lr=0.01)
  x = Tensor(data(0, 8, 32))
  history, sizes = [], []
  for step in range(40):
    opt.zero_grad()
    loss = lin(x).square().mean()
    loss.backward()
    opt.step()
    history.append(loss.detach())                          # each step's parameters stayed alive behind it (+1 MB/step)
    if step in (9, 39): sizes.append(sum(b.nbytes for b in set(buffers.values())))
  assert sizes[1] - sizes[0] < 30 * 64, f"{sizes[1] - sizes[0]} bytes more live after 30 more steps"
  assert all(np.isfinite(h.item()) for h in history)


def test_a_cross_device_assign_is_refused_where_it_is_made():
  w = Tensor(data(0, 3))
  with pytest.raises(Exception, match="assign: a tensor on PYTHON into one on C"): w.assign(Tensor(data(1, 3), device="PYTHON"))
