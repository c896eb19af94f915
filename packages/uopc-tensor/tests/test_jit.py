"""uopc.jit: a captured function replays exactly what running it would compute, without running its body, and refuses
what a replay can't reproduce."""
import numpy as np
import pytest
import uopc.runtime as runtime
from uopc.tensor import Tensor
from uopc.jit import jit, JitError
from uopc import nn
from uopc.backends.c import CBackend


def data(seed: int, *shape):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def mlp_trainer(jitted: bool):
  Tensor.manual_seed(0)
  l1, l2 = nn.Linear(3, 8), nn.Linear(8, 2)
  opt = nn.AdamW([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.05)
  calls = []
  def step(x, y):
    calls.append(1)
    opt.zero_grad()
    loss = l2(l1(x).relu()).cross_entropy(y)
    loss.backward()
    opt.step()
    return loss
  return (jit(step) if jitted else step), calls, [l1.weight, l1.bias, l2.weight, l2.bias]


def test_a_replayed_training_step_matches_the_plain_one_bit_for_bit_and_skips_the_body():
  plain, _, p_params = mlp_trainer(False)
  fast, calls, j_params = mlp_trainer(True)
  for i in range(6):
    x, y = Tensor(data(i, 16, 3)), Tensor((np.arange(16) % 2).astype(np.int32))
    a, b = plain(x, y).item(), fast(x, y).item()
    assert a == b, (i, a, b)
  assert len(calls) == 2                                     # run once, captured once, replayed four times
  for p, q in zip(p_params, j_params): np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_a_replay_launches_kernels_and_nothing_else(monkeypatch):
  fast, calls, _ = mlp_trainer(True)
  x, y = Tensor(data(0, 16, 3)), Tensor((np.arange(16) % 2).astype(np.int32))
  fast(x, y), fast(x, y)
  import uopc.tensor.core, uopc.runtime
  def forbidden(*a, **k): raise AssertionError("a replay built, kernelized, compiled or realized a graph")
  # the names the Tensor road really calls (a replay that ran the body would reach each of them)
  core = uopc.tensor.core
  for module, name in [(core, "kernelize_cached"), (core, "kernelize"), (core, "run_schedule"),
                       (core, "grad_of"), (uopc.runtime, "compile_kernel"), (uopc.runtime, "compile_kernels")]:
    monkeypatch.setattr(module, name, forbidden)
  monkeypatch.setattr(Tensor, "realize", forbidden)
  monkeypatch.setattr(Tensor, "_new", forbidden)
  loss = fast(x, y)
  assert len(calls) == 2
  monkeypatch.undo()
  assert np.isfinite(loss.item())


def test_replays_on_the_c_backend_become_one_native_call_that_reads_each_calls_buffers(monkeypatch):
  """From its GRAPH_AFTER-th replay a capture's launches are one C function (runtime.LaunchGraph, CGraph): it must read
  the buffers of each call (new inputs, the outputs handed out in turn), not the ones it was built with."""
  plain, _, p_params = mlp_trainer(False)
  fast, calls, j_params = mlp_trainer(True)
  runs = runtime.LaunchGraph.GRAPH_AFTER + 5
  for i in range(2 + runs):
    x, y = Tensor(data(i, 16, 3)), Tensor((np.arange(16) % 2).astype(np.int32))
    want = plain(x, y).item()
    if i > 2 + runtime.LaunchGraph.GRAPH_AFTER:   # the graph is built: no kernel is launched one at a time any more
      monkeypatch.setattr(CBackend, "launch", lambda *a, **k: (_ for _ in ()).throw(AssertionError("a launch outside the graph")))
    assert fast(x, y).item() == want, i
    monkeypatch.undo()
  plan = fast._plans[0]
  assert len(plan.steps) >= 2   # cross_entropy's index check splits the launches
  assert all(graph.native is not None for graph, _ in plan.steps if graph.launches)
  assert len(calls) == 2
  for p, q in zip(p_params, j_params): np.testing.assert_array_equal(p.numpy(), q.numpy())


def test_constant_indices_are_checked_once_on_the_host_and_split_no_replay():
  """x[:, -1] and x[:, 3] index with constants: checked when the graph is built (an out-of-range one is refused there,
  as before), they become no kernel and no check that a replay runs again between its launches."""
  @jit
  def last(x): return (x[:, -1] + x[:, 3]).exp()
  x = Tensor(data(0, 4, 6))
  for i in range(5):
    x = Tensor(data(i, 4, 6))
    np.testing.assert_allclose(last(x).numpy(), np.exp(x.numpy()[:, -1] + x.numpy()[:, 3]), rtol=1e-6)
  assert [check for _, check in last._plans[0].steps] == [None] and len(last._plans[0].launches) == 1
  with pytest.raises(Exception, match="out of"): x[:, 6].numpy()


def test_inputs_of_another_shape_or_dtype_are_refused_naming_both():
  f = jit(lambda a: (a * 2).sum())
  for _ in range(2): f(Tensor(data(0, 4, 3)))
  with pytest.raises(JitError, match=r"tensor argument 0 is f32\(5, 3\), but the function was captured with f32\(4, 3\)"): f(Tensor(data(0, 5, 3)))
  with pytest.raises(JitError, match=r"is i32\(4, 3\)"): f(Tensor(np.ones((4, 3), np.int32)))


def test_other_arguments_must_equal_the_captured_ones():
  f = jit(lambda a, k: (a * k).sum())
  for _ in range(2): f(Tensor(data(0, 4)), 2.0)
  assert f(Tensor(np.ones(4, np.float32)), 2.0).item() == 8.0
  with pytest.raises(JitError, match="other arguments"): f(Tensor(data(0, 4)), 3.0)


def test_new_inputs_are_copied_in_and_outputs_are_fresh_each_call():
  f = jit(lambda a, b: a @ b + 1)
  for seed in range(5):
    a, b = data(seed, 4, 6), data(seed + 10, 6, 3)
    np.testing.assert_allclose(f(Tensor(a), Tensor(b)).numpy(), a @ b + 1, rtol=1e-5)


@pytest.mark.parametrize("inside", ["item", "numpy"])
def test_reading_values_inside_a_capture_is_refused(inside):
  def fn(a):
    if inside == "item": a.sum().item()
    if inside == "numpy": a.numpy()
    return a * 2
  f = jit(fn)
  f(Tensor(data(0, 4)))
  with pytest.raises(JitError, match="inside a function uopc.jit is capturing"): f(Tensor(data(0, 4)))


@pytest.mark.parametrize("draw", ["rand", "randn", "uniform", "dropout", "rand_like"])
def test_random_numbers_in_a_replay_are_the_ones_a_plain_call_draws(draw):
  def fn(a):
    if draw == "rand": return a + Tensor.rand(*a.shape)
    if draw == "randn": return a * Tensor.randn(*a.shape, dtype="half").float()
    if draw == "uniform": return a - Tensor.uniform(*a.shape, low=-2, high=3)
    if draw == "dropout": return a.dropout(0.5) * 2
    return a.rand_like() + a
  f = jit(fn)
  Tensor.manual_seed(7)
  got = [f(Tensor(data(k, 4, 5))).numpy() for k in range(5)]
  Tensor.manual_seed(7)
  want = [fn(Tensor(data(k, 4, 5))).numpy() for k in range(5)]
  for g, w in zip(got, want): np.testing.assert_array_equal(g, w)
  assert not np.array_equal(got[3], got[4])


def cache_writer(jitted: bool):
  """A key/value-cache step: write row `at` of the state, then read the whole state back in the same call."""
  K = Tensor.zeros(5, 2).realize()
  W = Tensor(data(3, 3, 2)).realize()
  def step(tok, at):
    v = (tok.reshape(1, 3) @ W).reshape(1, 2)
    K.assign(at.reshape(5, 1).where(v, K))
    return v @ K.transpose()
  return (jit(step) if jitted else step), K


def test_state_written_then_read_in_the_same_call_accumulates_across_replays():
  # the first call leaves no assign lazy: otherwise the capture computes it inside its kernels and replays it forever
  plain, Kp = cache_writer(False)
  fast, Kj = cache_writer(True)
  for pos in range(5):
    tok, at = data(pos, 3), np.arange(5) == pos
    np.testing.assert_array_equal(fast(Tensor(tok), Tensor(at)).numpy(), plain(Tensor(tok), Tensor(at)).numpy())
  np.testing.assert_array_equal(Kj.numpy(), Kp.numpy())


def test_state_a_replay_writes_is_bound_at_the_next_replay_without_a_lookup(monkeypatch):
  """A replay hands the cache it wrote to its tensor (a new uop) and notes it where the next bind looks, so a decode
  loop's caches are found as its unchanged weights are: the next replay looks nothing up, and reads the values written."""
  import uopc.jit as J
  plain, Kp = cache_writer(False)
  fast, Kj = cache_writer(True)
  lookups = []
  original = J.buffer_of
  for pos in range(5):
    if pos == 3: monkeypatch.setattr(J, "buffer_of", lambda u: lookups.append(u) or original(u))
    tok, at = data(pos, 3), np.arange(5) == pos
    np.testing.assert_array_equal(fast(Tensor(tok), Tensor(at)).numpy(), plain(Tensor(tok), Tensor(at)).numpy())
  np.testing.assert_array_equal(Kj.numpy(), Kp.numpy())
  assert len(lookups) <= 2 * 2                                # the two calls' new arguments (tok, at) alone


@pytest.mark.parametrize("when", [1, 3])
def test_state_assigned_lazily_outside_is_read_as_its_value(when):
  plain, Kp = cache_writer(False)
  fast, Kj = cache_writer(True)
  for pos in range(5):
    if pos == when:
      for K in (Kp, Kj): K.assign(K * 2 + 1)          # lazy: a capture must not bake the graph in, a replay must see it
    tok, at = data(pos, 3), np.arange(5) == pos
    np.testing.assert_array_equal(fast(Tensor(tok), Tensor(at)).numpy(), plain(Tensor(tok), Tensor(at)).numpy())
  np.testing.assert_array_equal(Kj.numpy(), Kp.numpy())


@pytest.mark.parametrize("inner_calls_before", [0, 3])
def test_a_jit_function_called_inside_a_capture_becomes_part_of_it(inner_calls_before):
  inner = jit(lambda a: a * 3)
  for k in range(inner_calls_before): inner(Tensor(data(k, 4)))       # 3: inner is replaying when outer captures
  outer = jit(lambda a: inner(a + 1).sum())
  for k in range(4):
    x = data(k, 4)
    np.testing.assert_allclose(outer(Tensor(x)).item(), ((x + 1) * 3).sum(), rtol=1e-6)


def test_the_learning_rate_and_loaded_weights_set_between_replays_reach_the_capture():
  lin = nn.Linear(3, 2)
  opt = nn.SGD([lin.weight, lin.bias], lr=0.1)
  @jit
  def step(x):
    opt.zero_grad()
    loss = lin(x).square().mean()
    loss.backward()
    opt.step()
    return loss
  x = Tensor(data(0, 8, 3))
  for _ in range(3): step(x)
  saved = {k: v.numpy().copy() for k, v in nn.get_state_dict(lin).items()}
  opt.lr = 0.0                                                # a replay now leaves the weights alone
  step(x)
  for k, v in nn.get_state_dict(lin).items(): np.testing.assert_array_equal(v.numpy(), saved[k])
  fresh = {k: np.full_like(v, 0.5) for k, v in saved.items()}
  nn.load_state_dict(lin, fresh)                              # and computes its loss from weights loaded after the capture
  expected = ((data(0, 8, 3) @ fresh["weight"].T + fresh["bias"]) ** 2).mean()
  np.testing.assert_allclose(step(x).item(), expected, rtol=1e-5)


def test_an_output_that_is_an_input_is_that_input():
  f = jit(lambda a, b: (a, b * 2))
  for k in range(4):
    a, b = Tensor(data(k, 4)), Tensor(data(k + 9, 4))
    ra, rb = f(a, b)
    assert ra is a
    np.testing.assert_array_equal(rb.numpy(), data(k + 9, 4) * 2)


def test_the_debug_road_of_a_replay_times_every_launch(monkeypatch, capfd):
  f = jit(lambda a: (a.exp() * 2).sum())
  for _ in range(2): f(Tensor(data(0, 64)))
  p = runtime._Profile()
  p._registered = True
  monkeypatch.setattr(runtime, "profile", p)
  monkeypatch.setenv("UOPC_DEBUG", "1")
  f(Tensor(data(0, 64))).numpy()
  assert sum(n for n, _ in p.runs.values()) >= 1 and "ms" in capfd.readouterr().err


def test_a_jitted_training_step_computes_its_forward_and_backward_once():
  """opt.step() realizes the gradients and the loss in the update's schedule. Realized later (the JIT realizes every
  .grad a step set; a loop prints its loss), each was computed again from the weights: a GPT step ran 331 kernels and
  5.8 GFLOP where one schedule of loss, gradients and update is 241 kernels and 2.9 GFLOP."""
  from uopc.tensor.storage import is_realized
  rng = np.random.default_rng(0)
  params = [Tensor(rng.standard_normal(s).astype(np.float32), requires_grad=True) for s in ((16, 32), (32,), (32, 4))]
  opt = nn.AdamW(params, lr=1e-3)
  def step(x, y):
    opt.zero_grad()
    loss = ((x @ params[0] + params[1]).gelu() @ params[2]).cross_entropy(y)
    loss.backward()
    opt.step()
    return loss
  x, y = Tensor(rng.standard_normal((8, 16)).astype(np.float32)), Tensor(rng.integers(0, 4, 8).astype(np.int32))
  loss = step(x, y)                          # plainly: the loss and every .grad are computed by the step's schedule
  assert is_realized(loss.uop) and all(is_realized(p.grad.uop) for p in params)
  opt.zero_grad()
  loss = ((x @ params[0] + params[1]).gelu() @ params[2]).cross_entropy(y)
  loss.backward()
  one_schedule = len(loss.schedule(*opt.update(), *[p.grad for p in params]))
  fast = jit(step)
  for _ in range(3): fast(x, y)
  assert len(fast._plans[0].launches) == one_schedule


def _counting_static(plan, monkeypatch) -> list:
  runs, graph = [], plan.static
  class Counting:
    launches = graph.launches
    def __call__(self, *a):
      runs.append(1)
      return graph(*a)
  monkeypatch.setattr(plan, "static", Counting())
  return runs


def test_launches_computed_from_unchanged_state_are_skipped_until_the_state_changes(monkeypatch):
  """x @ w.T with w a weight: the C backend packs w into panels first, a launch that reads state alone. A replay whose w
  is the buffer the last replay read, unwritten since, skips it (sampling's decode step repacked every weight at every
  token); a new w (assign, load_state_dict's write), or the same buffer written again (copyin), runs it again."""
  w = Tensor(data(0, 256, 512))
  f = jit(lambda x: x @ w.T)
  xs = [data(k, 16, 512) for k in range(8)]
  for k in range(2): f(Tensor(xs[k]))
  plan = f._plans[0]
  assert plan.static is not None and len(plan.static.launches) < len(plan.launches)
  runs = _counting_static(plan, monkeypatch)
  def check(k):
    np.testing.assert_allclose(f(Tensor(xs[k])).numpy(), xs[k] @ w.numpy().T, rtol=1e-4, atol=1e-4)
  check(2); check(3); check(4)
  assert len(runs) == 1                                      # the first replay packs (its temporaries are new), then not
  w.assign(Tensor(data(1, 256, 512))).realize()
  check(5)
  assert len(runs) == 2
  w._write(data(2, 256, 512))
  check(6)
  assert len(runs) == 3
  from uopc.tensor.storage import buffer_of
  buffer_of(w.uop).copyin(data(3, 256, 512))                  # written in place (uopc.onnx's initializers are)
  check(7)
  assert len(runs) == 4


@pytest.mark.parametrize("m,k,n,transposed", [(16, 128, 384, True), (256, 10, 256, True), (40, 96, 64, True), (256, 256, 10, False)])
def test_small_gemms_whose_weight_is_packed_match_numpy_plain_and_replayed(m, k, n, transposed):
  """x @ w.T packs w from 16 rows and 128K multiply-adds (a decode step's projection, an MLP's backward through a 10-class
  head), and x @ W copies a W of 10 columns transposed (an MLP's head): plain, replayed (the copy skipped while the
  weight is unchanged), and after it is assigned anew."""
  w = Tensor(data(0, n, k) if transposed else data(0, k, n))
  mm = (lambda x: x @ w.T) if transposed else (lambda x: x @ w)
  want = lambda x: x @ (w.numpy().T if transposed else w.numpy())
  f = jit(mm)
  for s in range(5):
    x = data(s + 1, m, k)
    np.testing.assert_allclose(mm(Tensor(x)).numpy(), want(x), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), want(x), rtol=1e-4, atol=1e-4)
    if s == 2: w.assign(Tensor(data(9, *w.shape))).realize()


def test_a_replays_temporaries_share_buffers_where_their_lifetimes_allow_but_a_static_launchs_keep_theirs(monkeypatch):
  """uopc.memory: a replay's temporaries take turns in Buffers (a chain of staged steps needs two, whatever its length),
  except what a static launch writes (w packed into panels), which a later replay reads without running that launch
  again. Every replay is NumPy's answer; no launch is handed one Buffer twice."""
  w = Tensor(data(0, 256, 512))
  def f(x):
    h = x @ w.T
    for _ in range(6): h = (h * 0.5 + 1.0).contiguous()
    return h.sum(1)
  jf = jit(f)
  xs = [data(k, 16, 512) for k in range(6)]
  for k in range(2): jf(Tensor(xs[k]))
  plan = jf._plans[0]
  assert plan.static is not None and len(plan.temp_specs) < len(plan.temps)
  static_out = {s for prog, ss in plan.static.launches for p, s in zip(prog.params, ss) if p.written}
  assert static_out and all(list(plan.temp_groups.values()).count(plan.temp_groups[s]) == 1 for s in static_out)
  runs = _counting_static(plan, monkeypatch)
  for k in range(2, 6):
    ref = xs[k] @ w.numpy().T
    for _ in range(6): ref = ref * 0.5 + 1.0
    np.testing.assert_allclose(jf(Tensor(xs[k])).numpy(), ref.sum(1), rtol=1e-4, atol=1e-3)
    for _, ss in plan.launches: assert len({id(plan.table[s]) for s in ss if s in plan.temps}) == len([s for s in ss if s in plan.temps])
  assert len(runs) == 1   # the pack ran once: its panels were still there


def test_state_another_capture_rewrites_in_place_is_read_again():
  """A training step's replays hand its weights out in buffers of their own, written again once no tensor holds them:
  the same Buffer can come back to a weight with new values. A capture that read it must see them (Buffer.version)."""
  Tensor.manual_seed(0)
  lin = nn.Linear(512, 256, bias=False)
  opt = nn.SGD([lin.weight], lr=0.5)
  @jit
  def train(x):
    opt.zero_grad()
    loss = lin(x).square().mean()
    loss.backward()
    opt.step()
    return loss
  infer = jit(lambda x: lin(x))
  x = Tensor(data(0, 16, 512))
  from uopc.tensor.storage import buffer_of
  held = []
  for k in range(8):
    train(x), train(x)          # two steps: the weight's buffers take turns, so it is back in the one read last time
    held.append(buffer_of(lin.weight.uop))
    np.testing.assert_allclose(infer(x).numpy(), data(0, 16, 512) @ lin.weight.numpy().T, rtol=1e-4, atol=1e-4)
  assert infer._plans[0].static is not None
  assert any(a is b for a, b in zip(held, held[1:]))         # the same Buffer, written again in between


def test_a_replayed_gather_reads_each_calls_indices_and_checks_them():
  # the GATHER's indices are an argument: every replay loads the rows the call's own indices pick, and refuses one out
  # of range as a plain call does
  rng = np.random.default_rng(2)
  W = rng.standard_normal((50, 8)).astype(np.float32)
  w = Tensor(W)
  step = jit(lambda i: (w[i] * 2).realize())
  for n in range(5):
    idx = rng.integers(-50, 50, (3, 4)).astype(np.int32)
    np.testing.assert_array_equal(step(Tensor(idx)).numpy(), W[idx] * 2)
  with pytest.raises(Exception, match="index 50 is out of range for axis 0 of size 50"): step(Tensor(np.array([[0, 1, 2, 50]] * 3, np.int32)))
