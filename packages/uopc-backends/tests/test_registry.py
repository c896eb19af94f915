"""The backend registry: backends by name, case-insensitively, built in or from the entry point group
"uopc.backends"; the C backend's verbs end to end; and uopc.testing's helpers."""
import os, subprocess, sys
import numpy as np
import pytest
import uopc.backends as backends
from uopc.dtype import dtypes
from uopc.uop import Ops, buf
from uopc.rangeify import lower, Opts
from uopc.linearize import linearize
from uopc.backends import BackendError, LinearProgram, get_backend, available_backends
from uopc.backends.c import CBackend
from uopc.runtime import program_buffers
from uopc.testing import np_dtype, run_shaped


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("UOPC_CACHE_DIR", str(tmp_path / "cache"))


def test_the_c_backend_is_found_by_name_in_any_case():
  c = get_backend("C")
  assert isinstance(c, CBackend) and c.name == "C"
  assert get_backend("c") is c and get_backend() is c


def test_the_c_backends_verbs_run_a_kernel_end_to_end():
  be = get_backend("C")
  x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
  lin = tuple(linearize(lower(buf(0, 12).reshape((3, 4)).reduce(Ops.MAX, 1), buf(1, 3))))
  params = tuple(program_buffers(lin))
  prog = be.compile(be.renderer.render(LinearProgram("rowmax", lin, params)), "rowmax")
  bufs = [be.alloc(b.shape[0], b.dtype) for b in params]
  assert [(a.shape, a.dtype) for a in bufs] == [((12,), np.float32), ((3,), np.float32)]
  be.copyin(bufs[0], x.reshape(-1))                    # the contract: flat arrays of the buffer's dtype and size
  be.launch(prog, bufs)
  out = be.copyout(bufs[1])
  assert np.array_equal(out, x.max(1))
  out[:] = 0                                             # copyout hands back a copy, not the backend's buffer
  assert np.array_equal(be.copyout(bufs[1]), x.max(1))


def test_a_launch_passes_each_handles_address_whatever_the_array():
  """launch and a graph read each handle's address through a ctypes view of its memory (a sixth of NumPy's .ctypes
  time), and through .ctypes where there is no writable contiguous memory to view: the address is the same."""
  from uopc.backends.c import _address
  be = get_backend("C")
  plain = be.alloc(12, dtypes.f32)
  frozen = np.arange(4, dtype=np.float32)
  frozen.flags.writeable = False
  for a in (plain, plain[3:], np.zeros(0, np.float32), frozen, np.zeros(8, np.float32)[::2]):
    assert _address(a) == a.ctypes.data
  # a kernel launched on views at an offset reads and writes there
  lin = tuple(linearize(lower(buf(0, 4) * 2.0, buf(1, 4))))
  prog = be.compile(be.renderer.render(LinearProgram("twice", lin, tuple(program_buffers(lin)))), "twice")
  x = be.alloc(8, dtypes.f32)
  x[:] = np.arange(8)
  be.launch(prog, [x[4:], x[:4]])
  assert np.array_equal(x, [8, 10, 12, 14, 4, 5, 6, 7])


def test_an_unknown_backend_is_an_error_that_lists_the_available_ones():
  with pytest.raises(BackendError) as e: get_backend("TPU9000")
  msg = str(e.value)
  assert "'TPU9000'" in msg and "available: " in msg
  assert msg.split("available: ")[1].split(", ") == available_backends() and "C" in available_backends()


class ToyBackend:
  """A third-party backend as another distribution would ship it."""
  name = "Toy"


class FakeEntryPoint:
  def __init__(self, name, target): self.name, self.target = name, target
  def load(self): return self.target


@pytest.fixture
def toy_installed(monkeypatch):
  """A distribution that registers ToyBackend under the entry point group uopc.backends."""
  real = backends.importlib.metadata.entry_points
  eps = [FakeEntryPoint("Toy", ToyBackend)]
  monkeypatch.setattr(backends.importlib.metadata, "entry_points", lambda **kw: eps if kw.get("group") == "uopc.backends" else real(**kw))
  monkeypatch.setattr(backends, "_instances", {})       # backends made during this test don't outlive it
  monkeypatch.setattr(backends, "_registered", {})      # nor do those another test registered in this process


def test_a_backend_registered_under_the_uopc_backends_entry_point_group_is_found_by_name(toy_installed):
  toy = get_backend("toy")
  assert isinstance(toy, ToyBackend) and get_backend("TOY") is toy
  assert available_backends() == ["C", "CUDA", "PYTHON", "Toy"]
  assert isinstance(get_backend("C"), CBackend)
  with pytest.raises(BackendError, match="available: C, CUDA, PYTHON, Toy"): get_backend("nope")


def test_a_broken_entry_point_installation_does_not_hide_the_c_backend(monkeypatch):
  def broken(**kw): raise RuntimeError("corrupt metadata")
  monkeypatch.setattr(backends.importlib.metadata, "entry_points", broken)
  monkeypatch.setattr(backends, "_instances", {})
  monkeypatch.setattr(backends, "_registered", {})
  assert available_backends() == ["C", "CUDA", "PYTHON"] and isinstance(get_backend("c"), CBackend)
  with pytest.raises(BackendError, match="available: C, CUDA, PYTHON"): get_backend("toy")


# ---- uopc.testing ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, want", [(dtypes.bool, np.bool_), (dtypes.i32, np.int32), (dtypes.f32, np.float32), (dtypes.f16, np.float16)])
def test_np_dtype_holds_each_dtype(dtype, want):
  d = np_dtype(dtype)
  assert d == np.dtype(want) and d.itemsize == dtype.itemsize


def test_np_dtype_of_void_is_an_error():
  with pytest.raises(BackendError, match="void"): np_dtype(dtypes.void)


def test_run_shaped_lowers_runs_and_reshapes_like_numpy():
  rng = np.random.default_rng(3)
  x, y = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal(24).astype(np.float32)
  root = (buf(0, 24).reshape((4, 6)) * buf(1, 24).reshape((4, 6))).reduce(Ops.ADD, 1)
  want = (x.astype(np.float64) * y.reshape(4, 6)).sum(1)
  for opts in (None, Opts(upcast={0: 2}, unroll=3), Opts(thread=0)):
    got = run_shaped(root, [x, y], opts=opts)
    assert got.shape == (4,) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_run_shaped_handles_integers_and_a_scalar_result():
  v = np.array([3, -9, 4, 12, -1], np.int32)
  got = run_shaped(buf(0, 5, dtypes.i32).reduce(Ops.MAX, 1), [v], backend="c")
  assert got.shape == () and got == v.max()


def test_run_shaped_with_a_buffer_slot_it_has_no_input_for_is_an_error():
  root = buf(0, 4) + buf(1, 4)
  with pytest.raises(BackendError, match=r"slots \[0, 1\].*1 inputs"): run_shaped(root, [np.zeros(4, np.float32)])


def test_run_on_drives_any_backend_through_its_verbs():
  from uopc.uop import Ops
  from uopc.rangeify import lower
  from uopc.testing import run_on
  a, out = np.arange(12, dtype=np.float32), np.zeros(3, np.float32)
  run_on(get_backend("C"), lower(buf(0, 12).reshape((3, 4)).reduce(Ops.ADD, 1), buf(1, 3)), {0: a, 1: out})
  np.testing.assert_array_equal(out, a.reshape(3, 4).sum(1))


def test_register_backend_adds_a_backend_by_name_in_this_process(monkeypatch):
  monkeypatch.setattr(backends, "_instances", {})
  monkeypatch.setattr(backends, "_registered", {})
  made = []
  class Mine(CBackend):
    name = "MINE"
    def __init__(self):
      super().__init__()
      made.append(self)
  backends.register_backend("mine", Mine)
  assert "MINE" in available_backends() and get_backend("Mine") is get_backend("MINE") and len(made) == 1
  backends.register_backend("MINE", Mine)                  # registering again replaces it: a fresh instance
  assert get_backend("mine") is not made[0]
  with pytest.raises(BackendError, match="non-empty name"): backends.register_backend(" ", Mine)
  with pytest.raises(BackendError, match="needs a factory"): backends.register_backend("X", 3)


def test_an_empty_or_missing_backend_name_means_the_default(monkeypatch):
  assert get_backend(None) is get_backend("") is get_backend(" c ") is get_backend("C")


# ---- threads ---------------------------------------------------------------------------------------------------------

MANY_THREADS_ASK = r"""
import sys, threading
sys.setswitchinterval(1e-6)           # a thread switch every few bytecodes: the interleavings a busy process sees
import os, subprocess, sys
import numpy as np
from uopc.backends import BackendError, get_backend
from uopc.rangeify import lower
from uopc.runtime import Buffer, compile_program
from uopc.uop import buf
N = 32
start, made = threading.Barrier(N), [None] * N
def ask(i):
  start.wait()                        # every thread asks at the same moment
  be = get_backend("C")
  made[i] = (be, Buffer(be, 4, buf(0, 4).dtype).copyin(np.full(4, i, np.float32)))
threads = [threading.Thread(target=ask, args=(i,)) for i in range(N)]
for t in threads: t.start()
for t in threads: t.join()
prog = compile_program(lower(buf(0, 4) * 2.0, buf(1, 4)), get_backend("C"), "double")
refused = 0
for be, data in made:
  try: prog([data, Buffer(be, 4, data.dtype)])
  except BackendError: refused += 1
print(len({id(be) for be, _ in made}), refused)
"""


def test_threads_asking_for_a_backend_at_once_share_one_instance(tmp_path):
  # each thread used to build its own C backend, and memory made on the others was refused by a program compiled on
  # the one the registry kept ("lives on backend C, the program runs on C")
  env = {**os.environ, "UOPC_CACHE_DIR": str(tmp_path / "cache")}
  proc = subprocess.run([sys.executable, "-c", MANY_THREADS_ASK], env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  instances, refused = map(int, proc.stdout.split())
  assert (instances, refused) == (1, 0)
