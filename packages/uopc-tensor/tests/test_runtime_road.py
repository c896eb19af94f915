"""Tensor code on the one road (uopc.runtime): backends chosen by name run it (a counting subclass of C, and an
interpreter written only against the backend contract), no kernel writes outside its buffers when lowering drops
an input, no kernel materializes a view, and UOPC_DEBUG shows what ran."""
import os, re, subprocess, sys
import numpy as np
import pytest
import uopc.runtime as runtime
from uopc.dtype import dtypes
from uopc.backends import LinearProgram, register_backend, get_backend
from uopc.backends.c import CBackend
from uopc.interpret import run_linear
from uopc.opt import Caps
from uopc.tensor import Tensor, TensorError
from uopc import nn


# ---- backends by name ------------------------------------------------------------------------------------------------

class CountingBackend(CBackend):
  """The C backend, counting its launches."""
  name = "COUNTING"
  def __init__(self):
    super().__init__()
    self.launches = 0
  def launch(self, program, handles, global_size=None, local_size=None):
    self.launches += 1
    super().launch(program, handles, global_size, local_size)


class _Memory:
  __slots__ = ("values", "dtype")
  def __init__(self, n, dtype): self.values, self.dtype = [None] * n, dtype


class InterpreterBackend:
  """A backend written against the contract of uopc.backends alone: it renders nothing and runs the linearized program
  on python lists with the reference interpreter."""
  name = "INTERP"
  renderer = None
  caps = Caps()
  def compile(self, program, name):
    assert isinstance(program, LinearProgram) and program.name == name
    return program
  def alloc(self, n, dtype): return _Memory(n, dtype)
  def copyin(self, handle, array):
    assert array.ndim == 1 and array.size == len(handle.values) and array.dtype == np.dtype(handle.dtype.fmt)
    handle.values[:] = array.tolist()
  def copyout(self, handle):
    return np.array([0 if v is None else v for v in handle.values], dtype=np.dtype(handle.dtype.fmt))
  def launch(self, program, handles, global_size=None, local_size=None):
    run_linear(list(program.uops), {p.arg.slot: h.values for p, h in zip(program.params, handles)})
  def synchronize(self): pass


register_backend("COUNTING", CountingBackend)
register_backend("INTERP", InterpreterBackend)


def mlp_step(device: str) -> list[np.ndarray]:
  """One SGD step of a small MLP with cross-entropy, all tensors on `device`: the loss and the updated parameters."""
  rng = np.random.default_rng(0)
  x = Tensor(rng.standard_normal((4, 3)).astype(np.float32), device=device)
  y = Tensor(np.array([0, 1, 1, 0], np.int32), device=device)
  w1 = Tensor(rng.standard_normal((3, 5)).astype(np.float32), requires_grad=True, device=device)
  w2 = Tensor(rng.standard_normal((5, 2)).astype(np.float32), requires_grad=True, device=device)
  opt = nn.SGD([w1, w2], lr=0.1, momentum=0.9)
  loss = (x @ w1).relu().matmul(w2).cross_entropy(y)
  loss.backward()
  opt.step()
  return [loss.numpy(), w1.numpy(), w2.numpy(), (x.softmax(-1) * 2).max(0).numpy()]


def test_a_registered_subclass_of_the_c_backend_runs_tensor_code():
  want = mlp_step("C")
  got = mlp_step("counting")
  counting = get_backend("COUNTING")
  assert counting.launches > 5
  for g, w in zip(got, want): np.testing.assert_array_equal(g, w)


def test_a_backend_written_only_against_the_contract_runs_the_same_code():
  want = mlp_step("C")
  got = mlp_step("INTERP")
  for g, w in zip(got, want): np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_tensors_on_two_backends_do_not_mix_silently():
  a, b = Tensor([1.0, 2.0], device="COUNTING"), Tensor([3.0, 4.0])
  with pytest.raises(Exception, match="lives on backend C, the program runs on COUNTING"): (a + b).numpy()


MOVABLE = {   # every dtype a Tensor holds, with values that stress it: i32 extremes, f16's range and its -0.0, NaN and inf
  "f32": np.array([[1.5, -0.0, np.inf], [np.nan, -3.4e38, 1e-45]], np.float32),
  "f16": np.array([[65504.0, -0.0, 6e-8], [np.nan, -np.inf, 0.333]], np.float16),
  "i32": np.array([[2**31 - 1, -2**31, 0], [7, -1, 123456789]], np.int32),
  "bool": np.array([[True, False, True], [False, False, True]]),
}


@pytest.mark.parametrize("device", ["PYTHON", "python"])
@pytest.mark.parametrize("name", MOVABLE)
@pytest.mark.parametrize("shape", [(2, 3), (), (0, 3)])
def test_to_moves_every_dtype_between_c_and_python_both_ways(name, shape, device):
  """.to("PYTHON") was cast("PYTHON"): "unknown dtype". The value arrives bit for bit, with its dtype, on the backend
  named (case-insensitive), computes there, and comes back the same way; 0-d and empty tensors too."""
  arr = MOVABLE[name] if shape == (2, 3) else MOVABLE[name][0, :1].reshape(()) if shape == () else MOVABLE[name][:0]
  here = Tensor(arr)
  there = here.to(device)
  assert there.device == "PYTHON" and there.dtype is here.dtype and there.shape == arr.shape
  np.testing.assert_array_equal(there.numpy().reshape(-1).view(np.uint8), arr.reshape(-1).view(np.uint8))   # bits: -0.0 and NaN too
  doubled = there.maximum(there) if name == "bool" else there + there
  assert doubled.device == "PYTHON"
  with np.errstate(over="ignore"): want = arr | arr if name == "bool" else arr + arr   # i32 wraps, f16's 65504 doubles to inf
  np.testing.assert_array_equal(doubled.numpy(), want)
  back = doubled.to("C")
  assert back.device == "C" and back.dtype is here.dtype
  np.testing.assert_array_equal(back.numpy(), doubled.numpy())
  np.testing.assert_array_equal((back * 1 if name != "bool" else back).numpy(), doubled.numpy())   # and computes on C


def test_to_takes_torchs_forms_and_refuses_what_it_cant_do():
  t = Tensor([1.5, -2.5])
  assert t.to("C") is t                                                   # already there
  assert t.to("f16").dtype is dtypes.f16 and t.to(dtypes.i32).dtype is dtypes.i32 and t.to(np.float16).dtype is dtypes.f16
  both = t.to("PYTHON", "f16")
  assert (both.device, both.dtype) == ("PYTHON", dtypes.f16) and both.numpy().tolist() == [1.5, -2.5]
  kw = t.to(device="PYTHON", dtype=dtypes.i32)
  assert (kw.device, kw.dtype) == ("PYTHON", dtypes.i32) and kw.numpy().tolist() == [1, -2]
  like = Tensor([True], device="PYTHON")
  assert (t.to(like).device, t.to(like).dtype) == ("PYTHON", dtypes.bool)
  with pytest.raises(TensorError, match="'cpu' is neither a dtype nor a backend .*available"): t.to("cpu")
  with pytest.raises(TensorError, match="None is neither a device nor a dtype"): t.to(None)
  with pytest.raises(TensorError, match="requires a gradient, which can't flow back from another backend"):
    Tensor([1.0], requires_grad=True).to("PYTHON")
  moved = Tensor(Tensor([1.0], requires_grad=True).numpy(), device="PYTHON").requires_grad_()    # the way the message gives
  (moved * 3).sum().backward()
  assert moved.grad.device == "PYTHON" and moved.grad.numpy().tolist() == [3.0]


# ---- no write outside a buffer when an input disappears -------------------------------------------------------------

GUARD = 64
PATTERN = 0xA5


class GuardedBackend(CBackend):
  """The C backend with GUARD elements of a fixed byte pattern before and after every buffer it allocates."""
  name = "GUARDED"
  def __init__(self):
    super().__init__()
    self.blocks = []
  def alloc(self, n, dtype):
    raw = super().alloc(n + 2 * GUARD, dtype)
    raw.view(np.uint8)[:] = PATTERN
    raw[GUARD:GUARD + n] = 0
    self.blocks.append((raw, n))
    return raw[GUARD:GUARD + n]
  def damaged(self) -> list[int]:
    bad = []
    for i, (raw, n) in enumerate(self.blocks):
      b, item = raw.view(np.uint8), raw.dtype.itemsize
      if (b[:GUARD * item] != PATTERN).any() or (b[(GUARD + n) * item:] != PATTERN).any(): bad.append(i)
    return bad


register_backend("GUARDED", GuardedBackend)

EMPTY_REDUCTIONS = [
  ((4, 0), 1), ((0, 3), 0), ((2, 0, 3), 1), ((2, 0, 3), (0, 1)), ((3, 0), None), ((0,), 0), ((1, 0, 1), -2),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # NumPy's mean and var of nothing warn; the oracle is their nan
@pytest.mark.parametrize("shape, axis", EMPTY_REDUCTIONS)
@pytest.mark.parametrize("op", ["sum", "max", "min", "mean", "any", "all", "var"])
def test_reductions_over_empty_axes_write_nothing_outside_their_buffers(shape, axis, op):
  be = get_backend("GUARDED")
  x = np.zeros(shape, np.float32)
  t = Tensor(x, device="GUARDED")
  got = getattr(t, op)(axis).numpy() if op != "var" else t.var(axis).numpy()
  identity = {"sum": 0.0, "any": False, "all": True, "max": -np.inf, "min": np.inf}   # NumPy refuses max and min of nothing
  if op in identity: np.testing.assert_array_equal(got, np.full(got.shape, identity[op]))
  else: np.testing.assert_array_equal(got, getattr(np, op)(x, axis=axis, **({"ddof": 1} if op == "var" else {})))
  assert be.damaged() == []


PAD_SHRINK = [
  lambda t: t.pad(((3, 2), (0, 1), (1, 1)), value=3.456)[0:2],       # the shrink keeps only padding
  lambda t: t.pad(((-3, 2), (0, 0), (0, 0))),                         # a crop that removes the whole axis, then pad
  lambda t: t.pad(((2, 2), (1, 1), (0, 0)))[:, 0:1],
  lambda t: t.pad(((0, 0), (0, 0), (-3, 0))).sum(-1),
  lambda t: t[1:1].sum(0),
  lambda t: t.pad(((4, 0), (0, 0), (0, 0)), value=-1.0)[0:4].max((1, 2)),
  lambda t: (t[:, 0:0] * 2).reshape(3, 0, 3).sum((1, 2)) + t[:, 0, 0],
]


@pytest.mark.parametrize("case", range(len(PAD_SHRINK)))
def test_pads_and_shrinks_that_drop_the_input_write_nothing_outside_their_buffers(case):
  be = get_backend("GUARDED")
  data = np.arange(27, dtype=np.float32).reshape(3, 3, 3) + 1
  got = PAD_SHRINK[case](Tensor(data, device="GUARDED")).numpy()
  want = PAD_SHRINK[case](Tensor(data)).numpy()
  np.testing.assert_array_equal(got, want)
  assert be.damaged() == []


def test_the_issues_pad_example_is_all_padding_value():
  out = Tensor.ones(3, 3, 3).pad(((3, 2), (0, 1), (1, 1)), value=3.456)[0:2].numpy()
  assert out.shape == (2, 4, 5) and np.all(out == np.float32(3.456))


# ---- kernelize never materializes a view ---------------------------------------------------------------------------------

def test_the_gpt_step_never_writes_more_than_its_largest_tensor():
  """vocab 65, context 64, batch 16, 2 layers, width 128, 4 heads, AdamW: no kernel writes more than B*T*4C elements (a
  broadcast activation once took 256 MiB)."""
  from uopc.gpt import GPT, GPTConfig
  cfg = GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4)
  Tensor.manual_seed(0)
  model = GPT(cfg)
  params = model.parameters()
  assert sum(p.numel() for p in params) == 421_632
  opt = nn.AdamW(params, lr=1e-3)
  rng = np.random.default_rng(0)
  tokens = Tensor(rng.integers(0, 65, (16, 64)).astype(np.int32))
  targets = Tensor(rng.integers(0, 65, (16, 64)).astype(np.int32))
  loss = model.loss(tokens, targets)
  loss.backward()
  kernels = loss.schedule(*opt.update())
  largest = max(k.out.shape[0] for k in kernels)
  assert largest <= 16 * 64 * 4 * 128, f"a kernel writes {largest} elements"


# ---- UOPC_DEBUG ------------------------------------------------------------------------------------------------------

@pytest.fixture
def own_profile(monkeypatch):
  p = runtime._Profile()
  p._registered = True          # no summary at this test process's exit
  monkeypatch.setattr(runtime, "profile", p)
  return p


LINE = re.compile(r"^uopc C\s+(\S+)\s+\(.*\)\s+\d+\.\d{3} ms\s+\d+\.\d\d GFLOP/s\s+\d+\.\d\d GB/s$")


def fresh(n: float) -> Tensor:
  """A computation of a structure no other test compiles (the constant is part of it)."""
  x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
  return (x * n).softmax(-1)


def test_debug_level_0_prints_nothing(monkeypatch, capfd, own_profile):
  monkeypatch.delenv("UOPC_DEBUG", raising=False)
  fresh(1.25).numpy()
  monkeypatch.setenv("UOPC_DEBUG", "0")
  fresh(1.5).numpy()
  assert capfd.readouterr().err == "" and own_profile.runs == {}


def test_debug_level_1_prints_a_line_per_launch_with_its_time(monkeypatch, capfd, own_profile):
  monkeypatch.setenv("UOPC_DEBUG", "1")
  t = fresh(1.75)
  kernels = len(t.schedule())
  t.numpy()
  lines = capfd.readouterr().err.splitlines()
  assert len(lines) == kernels and all(LINE.match(line) for line in lines), lines
  assert "void " not in "".join(lines)
  assert sum(n for n, _ in own_profile.runs.values()) == kernels and "uopc summary: " in own_profile.summary()


def test_debug_level_2_also_prints_each_programs_source_once(monkeypatch, capfd, own_profile):
  monkeypatch.setenv("UOPC_DEBUG", "2")
  fresh(2.25).numpy()
  first = capfd.readouterr().err
  assert first.count("\nvoid r_3__4(") >= 1 and "-INFINITY" in first   # (the max reduction starts from it)
  fresh(2.25).numpy()                         # compiled already: launch lines only
  second = capfd.readouterr().err
  assert "void " not in second and all(LINE.match(line) for line in second.splitlines())


def test_debug_level_3_also_prints_the_linearized_uops(monkeypatch, capfd, own_profile):
  monkeypatch.setenv("UOPC_DEBUG", "3")
  fresh(3.25).numpy()
  err = capfd.readouterr().err
  assert ": linearized ---" in err and re.search(r"^\s+\d+\s+RANGE\s+i32", err, re.M) and re.search(r"^\s+\d+\s+\s*STORE\s+void", err, re.M)


def test_the_summary_at_exit_lists_kernels_launches_and_the_top_kernels(tmp_path):
  code = "import numpy as np\nfrom uopc.tensor import Tensor\nx = Tensor(np.ones((64, 64), np.float32))\nprint((x @ x).sum().item())\n"
  env = {**os.environ, "UOPC_DEBUG": "1", "UOPC_CACHE_DIR": str(tmp_path)}
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "262144.0"
  err = proc.stderr
  assert re.search(r"^uopc summary: \d+ kernels, \d+ launches, compile \d+\.\d+ s \(\d+ programs\), run \d+\.\d+ s$", err, re.M), err
  assert "uopc top kernels by time:" in err


def test_a_bad_debug_value_warns_and_means_quiet(monkeypatch, capfd, own_profile):
  monkeypatch.setenv("UOPC_DEBUG", "loud")
  with pytest.warns(UserWarning, match="UOPC_DEBUG='loud' is not a number"): fresh(4.25).numpy()
  assert own_profile.runs == {}


def test_dtypes_of_buffers_survive_the_road():
  for dt, vals in ((dtypes.i32, [1, -2, 3]), (dtypes.bool, [True, False, True]), (dtypes.f16, [0.5, -1.25, 3.0])):
    t = Tensor(np.array(vals, dtype=np.dtype(dt.fmt)))
    assert (t + t).numpy().dtype == np.dtype(dt.fmt) if dt is not dtypes.bool else t.numpy().tolist() == vals


# ---- long reductions: split into chunks, exact where f32 can be ----------------------------------------------------------

def test_a_long_sum_of_ones_is_exact_past_2_to_the_24():
  """One f32 accumulator stops growing at 2**24 (adding 1 to 16777216 rounds back); chunked partial sums don't."""
  assert Tensor.ones(2**25).sum().item() == 2**25
  assert Tensor.ones(20_000_000).mean().item() == 1.0


def test_a_16m_element_sum_is_as_accurate_as_numpys_pairwise_sum_within_a_small_factor():
  x = np.random.default_rng(0).standard_normal(1 << 24).astype(np.float32)
  exact = x.astype(np.float64).sum()
  ours, numpys = abs(Tensor(x).sum().item() - exact), abs(float(x.sum()) - exact)
  assert ours <= 8 * max(numpys, np.abs(x).sum() * 1e-9), (ours, numpys)


@pytest.mark.parametrize("n", [65536, 70001, 100003])
def test_long_reductions_of_any_length_match_numpy(n):
  x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
  assert Tensor(x).max().item() == x.max() and Tensor(-np.abs(x)).max().item() == (-np.abs(x)).max()
  assert Tensor(x.astype(np.int32) * 0 + 1).sum().item() == n
  np.testing.assert_allclose(Tensor(x).sum().item(), x.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)



@pytest.mark.parametrize("shape", [(37, 512), (64, 768), (3, 5, 1024)])
def test_sums_over_the_rows_of_wide_tensors_match_numpy(shape):
  # 32 vectors of columns or more are summed 4 vectors a row (uopc.opt); a mean and a max down the rows the same way
  x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
  axes = tuple(range(len(shape) - 1))
  np.testing.assert_allclose(Tensor(x).sum(axes).numpy(), x.astype(np.float64).sum(axes), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(Tensor(x).mean(axes).numpy(), x.astype(np.float64).mean(axes), rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(Tensor(x).max(axes).numpy(), x.max(axes))


@pytest.mark.parametrize("shape", [(64, 1024), (1024, 48), (1000, 1024), (3, 96, 1024)])
def test_transposes_of_long_axes_match_numpy(shape):
  # a transpose along a long last axis walks blocks of 16 of it across the threads (uopc.opt), stored straight into the
  # output (uopc.kernelize): every permutation, and an elementwise kernel with a transposed operand
  import itertools
  x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
  for perm in itertools.permutations(range(len(shape))):
    np.testing.assert_array_equal(Tensor(x).permute(*perm).contiguous().numpy(), x.transpose(perm))
  y = np.random.default_rng(1).standard_normal(shape[::-1]).astype(np.float32)
  np.testing.assert_allclose((Tensor(x) * 2 + Tensor(y).permute(*range(len(shape) - 1, -1, -1))).numpy(), x * 2 + y.T, rtol=1e-6)


def test_a_flip_of_a_large_tensor_matches_numpy():
  # flip's movement ops view (m, n) as (m, n * n): past i32 elements in all at 2048 x 1024, which lower refused
  x = np.random.default_rng(7).standard_normal((2048, 1024)).astype(np.float32)
  np.testing.assert_array_equal(Tensor(x).flip(1).numpy(), x[:, ::-1])
  np.testing.assert_array_equal(Tensor(x).flip((0, 1)).numpy(), x[::-1, ::-1])

def test_uopc_search_set_makes_tensor_code_search_each_new_kernel_on_its_inputs(monkeypatch):
  import uopc.search as search
  seen = []
  monkeypatch.setattr(search.Search, "first_run", lambda self, kernel, backend, inputs: seen.append((kernel, [b.size for b in inputs])))
  x = np.arange(12, dtype=np.float32).reshape(3, 4)
  monkeypatch.setenv("UOPC_SEARCH", "1")
  np.testing.assert_array_equal((Tensor(x) * 3 + 1).sum(1).numpy(), (x * 3 + 1).sum(1))
  assert seen and seen[0][1] == [12], "realize ran its kernels without the search policy"
  monkeypatch.setenv("UOPC_SEARCH", "0")
  seen.clear()
  (Tensor(x) * 5).sum(0).numpy()
  assert not seen


@pytest.mark.parametrize("before, env, after", [
  ("", {}, "(10000, 10, 10)"),                                       # CPython's default: raised (uopc.tensor.storage)
  ("", {"UOPC_GC": "0"}, "(700, 10, 10)"),                           # asked to leave the collector alone
  ("gc.set_threshold(500, 5, 5); ", {}, "(500, 5, 5)"),              # the program's own thresholds are kept
  ("gc.disable(); ", {}, "(10000, 10, 10) False")])                  # raised, and still disabled
def test_importing_uopc_tensor_raises_the_collectors_first_threshold_only_from_the_default(before, env, after):
  code = f"import gc; {before}import uopc.tensor; print(gc.get_threshold(), *([] if gc.isenabled() else [False]))"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "UOPC_GC": "", **env})
  assert out.returncode == 0, out.stderr
  assert out.stdout.strip() == after


def test_a_plain_training_step_makes_no_reference_cycles():
  # what the raised threshold rests on: a step's graph, its schedule and its launches die by reference counting alone
  import gc
  rng = np.random.default_rng(0)
  model = nn.Linear(8, 4)
  opt = nn.AdamW(list(nn.get_state_dict(model).values()), lr=1e-2)
  x, y = Tensor(rng.standard_normal((16, 8)).astype(np.float32)), Tensor(rng.integers(0, 4, 16).astype(np.int32))
  def step():
    opt.zero_grad()
    loss = model(x).relu().cross_entropy(y)
    loss.backward()
    opt.step()
    return loss.item()
  step(); step()                       # compiled, and the schedule remembered
  gc.collect()
  gc.disable()
  try:
    step()
    assert gc.collect() == 0
  finally: gc.enable()


def test_realize_holds_its_last_small_graph_until_it_realizes_another(monkeypatch):
  """The graph realized last is held, so that code called again builds the same nodes (found in UOp's cache); dropped
  as soon as another graph is realized, before that one's memory is allocated, and never held when it is more than
  HELD_MAX_KERNELS kernels, when its inputs hold more than HELD_MAX_BYTES (dropped by its tensor, a large input's
  memory goes at once) or when one is a value with a history (which holds its own graph in turn)."""
  import weakref
  from uopc.tensor import storage
  a, b = Tensor(np.ones((4, 4), np.float32)), Tensor(np.ones((4, 4), np.float32))
  first = a @ b
  held = weakref.ref(first.uop)
  first.realize()
  del first
  again = a @ b
  assert again.uop is held()                                     # built again: the held node, found in UOp's cache
  again.realize()
  assert held() is not None                                      # realized again: still held
  c = Tensor(np.ones((4, 4), np.float32))
  memory = weakref.ref(storage.buffer_of(c.uop))
  (c + 1.0).realize()
  assert held() is None                                          # dropped by the next graph realized
  del c
  (a + 2.0).realize()
  assert memory() is None                                        # and that one's input with it, when the next came
  big = Tensor(np.ones(storage.HELD_MAX_BYTES // 4 + 1, np.float32))
  memory = weakref.ref(storage.buffer_of(big.uop))
  (big * 2.0).realize()
  del big
  assert memory() is None
  h = (Tensor(np.ones(4, np.float32), requires_grad=True) * 2.0).realize()
  assert storage.buffer_uop(h.uop) in storage.history
  for make, max_kernels in ((lambda: h + 1.0, storage.HELD_MAX_KERNELS), (lambda: a * 3.0, 0)):
    monkeypatch.setattr(storage, "HELD_MAX_KERNELS", max_kernels)
    t = make()
    root = weakref.ref(t.uop)
    t.realize()
    del t
    assert root() is None
