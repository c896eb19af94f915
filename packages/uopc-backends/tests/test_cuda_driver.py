"""The CUDA backend's calls into the driver, against a stand-in for libcuda (testing/fake_libcuda.py: per-thread current
contexts, device memory, modules checked for their architecture, launches checked for their shared memory, sticky
faults), so that what a first run on a GPU would meet is checked on a machine without one. The compiler is faked too
(a cubin of the asked architecture): nvcc and ptxas are tested against the same kernels in test_gpu.py."""
import gc, os, subprocess, sys, textwrap
from pathlib import Path
import numpy as np
import pytest
from fake_libcuda import FakeLibcuda, cubin_for
from hostile import raises_one_line
import uopc.runtime as runtime
from uopc.uop import Ops, buf
from uopc.dtype import dtypes
from uopc.lowering import Opts
from uopc.kernelize import make_kernel
from uopc.backends import BackendError
from uopc.backends import cuda
from uopc.backends.cuda import CUDABackend, CUDACompiler, NoDeviceError
from uopc.runtime import Buffer, compile_kernel

TESTING = str(Path(__file__).resolve().parents[3] / "testing")


@pytest.fixture
def fake(monkeypatch):
  """A GPU (an sm_90 behind a CUDA 13.0 driver) in this process: the backend loads the stand-in instead of libcuda, and
  compiles to stand-in cubins of the asked architecture with a CUDA 13.0 toolkit."""
  lib = FakeLibcuda(arch="sm_90", driver_version=13000)
  monkeypatch.setattr(cuda, "_load_libcuda", lambda: lib)
  monkeypatch.setattr(cuda, "_driver_instance", None)
  monkeypatch.setattr(cuda, "_driver_error", None)
  monkeypatch.setattr(CUDACompiler, "compile", lambda self, src, name, arch: cubin_for(arch, name))
  monkeypatch.setattr(CUDACompiler, "toolkit", lambda self: (13, 0, "nvcc 13.0"))
  monkeypatch.setattr(runtime, "_programs", runtime.ProgramCache(64))
  for var in ("UOPC_CUDA_ARCH", "UOPC_CUDA_SYNC", "UOPC_DEBUG"): monkeypatch.delenv(var, raising=False)
  yield lib
  gc.collect()   # Buffers a traceback kept alive are freed into this driver, not the next test's


def doubled(backend, n: int = 64):
  """A program that doubles n floats, compiled for `backend`, and its two Buffers (the input filled with 0..n-1)."""
  prog = compile_kernel(make_kernel(buf(0, n) * 2.0, buf(1, n)), backend)
  return prog, [Buffer(backend, n, dtypes.f32).copyin(np.arange(n, dtype=np.float32)), Buffer(backend, n, dtypes.f32)]


def test_the_fake_driver_round_trips_memory_and_launches_a_program(fake):
  backend = CUDABackend()
  prog, bufs = doubled(backend)
  prog(bufs)
  backend.synchronize()
  np.testing.assert_array_equal(bufs[0].numpy(), np.arange(64, dtype=np.float32))
  assert [(x["name"], x["threads"], x["shared"]) for x in fake.launches] == [(prog.name, prog.local_size[0] if prog.local_size else 1, 0)]


# ---- 2. the device's own architecture ---------------------------------------------------------------------------------

def test_kernels_are_compiled_for_the_devices_own_arch_whatever_uopc_cuda_arch_says(fake, monkeypatch):
  # nox's cuda(arch='sm_80') session sets UOPC_CUDA_ARCH=sm_80 for its compile checks; the backend compiled sm_80 cubins
  # for an sm_90 device too, and every module load failed (an sm_80 cubin does not run on 9.0)
  monkeypatch.setenv("UOPC_CUDA_ARCH", "sm_80")
  with pytest.warns(RuntimeWarning, match=r"UOPC_CUDA_ARCH=sm_80 is not used: kernels are compiled for this machine's GPU, sm_90"):
    backend = CUDABackend()
  assert backend.arch == "sm_90"
  prog, bufs = doubled(backend)
  assert prog.handle.arch == "sm_90"
  prog(bufs)
  assert [x["name"] for x in fake.launches] == [prog.name]


def test_without_a_device_uopc_cuda_arch_chooses_what_kernels_are_compiled_for(monkeypatch):
  monkeypatch.setattr(cuda, "_load_libcuda", lambda: None)
  monkeypatch.setattr(cuda, "_driver_instance", None)
  monkeypatch.setattr(cuda, "_driver_error", None)
  monkeypatch.setenv("UOPC_CUDA_ARCH", "sm_80")
  assert CUDABackend().arch == "sm_80"
  monkeypatch.delenv("UOPC_CUDA_ARCH")
  assert CUDABackend().arch == "sm_90"
  with pytest.raises(NoDeviceError, match="libcuda.so.1"): CUDABackend().alloc(4, dtypes.f32)


def test_a_cubin_of_another_arch_is_refused_before_the_driver_sees_it(fake):
  backend = CUDABackend()
  prog, bufs = doubled(backend)
  prog.handle.arch = "sm_80"
  raises_one_line(lambda: prog(bufs), BackendError, f"{prog.name} was compiled for sm_80, the device is sm_90")


# ---- 4. a driver too old for the toolkit ------------------------------------------------------------------------------

def test_a_driver_older_than_the_toolkit_is_one_line_naming_both(fake):
  fake.driver_version = 12040
  backend = CUDABackend()
  msg = raises_one_line(lambda: backend.alloc(4, dtypes.f32), BackendError)
  assert "driver supports CUDA 12.4 (cuDriverGetVersion 12040)" in msg and "built by nvcc 13.0" in msg, msg
  assert not fake.called("cuMemAlloc_v2")


@pytest.mark.parametrize("driver", [13000, 13020, 14000])
def test_a_driver_for_the_toolkits_major_version_or_later_is_enough(fake, driver):
  # CUDA's minor version compatibility: a CUDA 13.x cubin loads with any driver for CUDA 13.0 and later
  fake.driver_version = driver
  prog, bufs = doubled(CUDABackend())
  prog(bufs)
  assert len(fake.launches) == 1


@pytest.mark.parametrize("words, version", [("Build cuda_13.0.r13.0/compiler.36424714_0", (13, 0)),
                                            ("Cuda compilation tools, release 12.4, V12.4.131", (12, 4)), ("nvrtc 13.5", (13, 5))])
def test_the_toolkit_version_is_read_from_nvcc_or_nvrtc(monkeypatch, words, version):
  tool = "nvrtc" if words.startswith("nvrtc") else "nvcc"
  monkeypatch.setattr(CUDACompiler, "tool", lambda self: tool)
  monkeypatch.setattr(CUDACompiler, "version", lambda self, t: words)
  assert CUDACompiler().toolkit() == (*version, f"{tool} {version[0]}.{version[1]}")


# ---- 5. the context in every thread; no free fails silently -----------------------------------------------------------

THREADS = """
import sys, threading
sys.path.insert(0, {testing!r})
import numpy as np
from fake_libcuda import FakeLibcuda, cubin_for
import uopc.backends.cuda as cuda
from uopc.uop import buf
from uopc.dtype import dtypes
from uopc.kernelize import make_kernel
from uopc.runtime import Buffer, compile_kernel
fake = FakeLibcuda()
cuda._load_libcuda = lambda: fake
cuda.CUDACompiler.compile = lambda self, src, name, arch: cubin_for(arch, name)
cuda.CUDACompiler.toolkit = lambda self: (13, 0, "nvcc 13.0")
backend = cuda.CUDABackend()
held = [Buffer(backend, 1024, dtypes.f32) for _ in range(4)]
errors = []
def collector():   # the last references die in another thread, as when the garbage collector runs there
  held.clear()
def worker():      # a thread of the user's that computes
  try:
    prog = compile_kernel(make_kernel(buf(0, 64) * 2.0, buf(1, 64)), backend)
    bufs = [Buffer(backend, 64, dtypes.f32).copyin(np.ones(64, np.float32)), Buffer(backend, 64, dtypes.f32)]
    prog(bufs)
    backend.synchronize()
    bufs[0].numpy()
  except Exception as e: errors.append(repr(e))
for target in (collector, worker):
  t = threading.Thread(target=target, name=target.__name__)
  t.start()
  t.join()
frees = sorted({{thread for name, args, thread in fake.calls if name == "cuMemFree_v2"}})
print(fake.live_bytes(), frees, errors)
"""


def test_buffers_freed_and_programs_run_in_other_threads_reach_the_driver():
  # the context was current only in the thread that made it: a Buffer the garbage collector freed in another thread
  # leaked (cuMemFree failed with INVALID_CONTEXT, ignored), and a launch from a worker thread failed
  env = {**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning"}
  for var in ("UOPC_CUDA_ARCH", "UOPC_CUDA_SYNC", "UOPC_DEBUG"): env.pop(var, None)
  out = subprocess.run([sys.executable, "-c", THREADS.format(testing=TESTING)], capture_output=True, text=True, env=env, timeout=300)
  assert out.returncode == 0, out.stderr
  assert out.stdout.split("\n")[0] == "0 ['collector', 'worker'] []", out.stdout + out.stderr


def test_a_failed_free_is_a_warning_that_names_the_memory(fake):
  backend = CUDABackend()
  handle = backend.alloc(256, dtypes.f32)
  fake.allocations.clear()                 # the driver no longer knows the address: cuMemFree says INVALID_VALUE
  with pytest.warns(RuntimeWarning, match=r"cuMemFree of 1024 bytes at 0x[0-9a-f]+ failed \(CUDA error 1: invalid argument\): that memory"):
    backend.free(handle)
  b = Buffer(backend, 16, dtypes.f32)      # and when a Buffer's finalizer frees it
  fake.allocations.clear()
  with pytest.warns(RuntimeWarning, match="cuMemFree of 64 bytes"): del b


# ---- 6. a kernel's fault, named --------------------------------------------------------------------------------------

@pytest.mark.parametrize("env", [{"UOPC_CUDA_SYNC": "1"}, {"UOPC_DEBUG": "1"}], ids=["UOPC_CUDA_SYNC", "UOPC_DEBUG"])
def test_under_debug_or_cuda_sync_a_faulting_kernel_is_named_by_its_launch(fake, monkeypatch, env, capsys):
  backend = CUDABackend()
  prog, bufs = doubled(backend)
  fake.fault_in = prog.name
  for k, v in env.items(): monkeypatch.setenv(k, v)
  msg = raises_one_line(lambda: prog(bufs), BackendError, f"kernel {prog.name} (")
  assert "failed on the device: CUDA error 700: an illegal memory access was encountered" in msg and "start a new process" in msg
  with pytest.warns(RuntimeWarning, match=r"cuMemFree failed \(CUDA error 700.*after a kernel's fault no device memory is freed") as seen:
    bufs.clear()                            # the context is lost: the frees fail, and say so once
  assert len(seen) == 1


def test_without_them_the_next_call_reports_the_fault_and_says_how_to_find_the_kernel(fake):
  backend = CUDABackend()
  prog, bufs = doubled(backend)
  fake.fault_in = prog.name
  prog(bufs)                                # launches are asynchronous: this one returns
  msg = raises_one_line(lambda: bufs[1].numpy(), BackendError, "cuMemcpyDtoH failed: CUDA error 700")
  assert "a kernel launched before this call faulted" in msg and "UOPC_CUDA_SYNC=1" in msg
  with pytest.warns(RuntimeWarning, match="after a kernel's fault"): bufs.clear()


# ---- 7. dynamic shared memory ----------------------------------------------------------------------------------------

def staged_gemm(m: int = 128, n: int = 128, k: int = 64):
  """A GEMM kernel and Opts whose tiles (64 rows of k of 128 + 4 floats each, for A and for B) take 66 KiB of shared
  memory: more than the 48 KiB a block gets without asking."""
  a = buf(0, m * k).reshape((m, 1, k)).expand((m, n, k))
  b = buf(1, k * n).reshape((k, n)).permute((1, 0)).reshape((1, n, k)).expand((m, n, k))
  return make_kernel((a * b).reduce(Ops.ADD, 1), buf(2, m * n)), Opts(gpu=True, stage=64, local={0: 16, 1: 16}, upcast={0: 8, 1: 8})


def test_a_kernel_with_more_than_48_kib_of_shared_memory_is_allowed_it_and_launched_with_it(fake):
  backend = CUDABackend()
  kernel, opts = staged_gemm()
  prog = compile_kernel(kernel, backend, opts)
  assert prog.handle.shared_bytes == 67584 and "extern __shared__ __align__(16) unsigned char uopc_shared[];" in prog.src
  bufs = [Buffer(backend, 128 * 64, dtypes.f32), Buffer(backend, 64 * 128, dtypes.f32), Buffer(backend, 128 * 128, dtypes.f32)]
  prog(bufs)
  [(function, attribute, value)] = fake.called("cuFuncSetAttribute")
  assert (attribute, value) == (8, 67584) and fake.functions[function][0] == prog.name     # MAX_DYNAMIC_SHARED_SIZE_BYTES
  assert [(x["name"], x["threads"], x["shared"]) for x in fake.launches] == [(prog.name, 256, 67584)]


def test_a_kernel_under_48_kib_is_launched_with_its_shared_memory_and_asks_nothing(fake):
  backend = CUDABackend()
  kernel, _ = staged_gemm(32, 32, 32)
  prog = compile_kernel(kernel, backend, Opts(gpu=True, stage=8, local={0: 4, 1: 4}, upcast={0: 2, 1: 2}))
  prog([Buffer(backend, 32 * 32, dtypes.f32) for _ in range(3)])
  assert not fake.called("cuFuncSetAttribute") and fake.launches[0]["shared"] == prog.handle.shared_bytes == 2 * 8 * (8 + 4) * 4


def test_more_shared_memory_than_the_device_has_is_refused_naming_both(fake):
  fake.max_shared = 48 * 1024
  backend = CUDABackend()
  kernel, opts = staged_gemm()
  prog = compile_kernel(kernel, backend, opts)
  bufs = [Buffer(backend, 128 * 64, dtypes.f32), Buffer(backend, 64 * 128, dtypes.f32), Buffer(backend, 128 * 128, dtypes.f32)]
  raises_one_line(lambda: prog(bufs), BackendError, f"{prog.name} needs 67584 bytes of shared memory per block, the device (sm_90) gives a "
                                                    "block at most 49152")


def test_the_rendered_size_is_what_the_backend_reads():
  src = textwrap.dedent(f"""\
    {cuda.SHARED_LINE.format(4096)}
    extern __shared__ __align__(16) unsigned char uopc_shared[];""")
  assert cuda.dynamic_shared_bytes(src) == 4096 and cuda.dynamic_shared_bytes("no shared memory") == 0


# ---- a launch graph: a JIT replay's launches as one CUDA graph -----------------------------------------------------------

def test_a_graph_launches_its_kernels_in_order_on_the_pointers_of_their_slots(fake):
  backend = CUDABackend()
  prog, (x, y) = doubled(backend)
  fake.arity[prog.name] = 2
  z = Buffer(backend, 64, dtypes.f32)
  # x -> y, then y -> z: slots 0, 1, 2
  g = backend.graph([(prog.handle, [0, 1], prog.global_size, prog.local_size), (prog.handle, [1, 2], prog.global_size, prog.local_size)], 3)
  g([x.handle, y.handle, z.handle])
  assert [(a["name"], a["args"], a["graph"]) for a in fake.launches] == \
    [(prog.name, [x.handle.ptr, y.handle.ptr], True), (prog.name, [y.handle.ptr, z.handle.ptr], True)]
  assert len(fake.called("cuGraphInstantiateWithFlags")) == 1 and not fake.called("cuLaunchKernel")
  w = Buffer(backend, 64, dtypes.f32)
  g.set(2, w.handle)                        # a replay's new output: the one node reading slot 2 is given it again
  g.run()
  assert fake.launches[-1]["args"] == [y.handle.ptr, w.handle.ptr] and fake.launches[-2]["args"] == [x.handle.ptr, y.handle.ptr]
  assert len(fake.called("cuGraphExecKernelNodeSetParams_v2")) == 1
  g.set(2, w.handle)                        # the same buffer again: nothing to hand over
  g.run()
  assert len(fake.called("cuGraphExecKernelNodeSetParams_v2")) == 1 and len(fake.called("cuGraphLaunch")) == 3
  raises_one_line(lambda: backend.graph([(prog.handle, [0, 3], None, None)], 3), BackendError, f"graph: {prog.name} reads slot 3 of 3")


@pytest.mark.parametrize("why", ["no graph API", "instantiation refused"])
def test_a_driver_without_graphs_gets_one_launch_per_kernel_and_a_warning(fake, monkeypatch, why):
  monkeypatch.setattr(cuda, "_graph_warned", False)
  if why == "no graph API": fake.no_graphs = True
  else: monkeypatch.setattr(type(fake), "_cuGraphInstantiateWithFlags", lambda self, *a: 1)      # CUDA_ERROR_INVALID_VALUE
  backend = CUDABackend()
  prog, bufs = doubled(backend)
  g = backend.graph([(prog.handle, [0, 1], prog.global_size, prog.local_size)], 2)
  says = "no CUDA graph API" if why == "no graph API" else "cuGraphInstantiateWithFlags failed: CUDA error 1"
  with pytest.warns(RuntimeWarning, match=f"could not be made .*{says}.*launched one by one"): g([b.handle for b in bufs])
  assert not fake.graphs                    # a graph that was made and not instantiated is destroyed
  g.run()
  assert [(a["args"], a["graph"]) for a in fake.launches] == [([b.handle.ptr for b in bufs], False)] * 2


def test_a_graph_under_cuda_sync_launches_each_kernel_and_names_the_one_that_faulted(fake, monkeypatch):
  backend = CUDABackend()
  prog, bufs = doubled(backend)
  g = backend.graph([(prog.handle, [0, 1], prog.global_size, prog.local_size)], 2)
  fake.fault_in = prog.name
  monkeypatch.setenv("UOPC_CUDA_SYNC", "1")
  msg = raises_one_line(lambda: g([b.handle for b in bufs]), BackendError, f"kernel {prog.name} (")
  assert "failed on the device: CUDA error 700" in msg and not fake.called("cuGraphLaunch")
  with pytest.warns(RuntimeWarning, match="after a kernel's fault"): bufs.clear()


def test_a_launch_graph_of_a_replayed_schedule_goes_native_on_cuda(fake):
  # runtime.LaunchGraph (what a JIT replays) hands its launches to the backend's graph at its GRAPH_AFTER-th call
  backend = CUDABackend()
  prog, (x, y) = doubled(backend)
  fake.arity[prog.name] = 2
  lg = runtime.LaunchGraph([(prog, [0, 1])])
  for _ in range(lg.GRAPH_AFTER + 1): lg([x, y])
  assert isinstance(lg.native, cuda.CUDAGraph) and [a["graph"] for a in fake.launches] == [False] * (lg.GRAPH_AFTER - 1) + [True] * 2
  assert all(a["args"] == [x.handle.ptr, y.handle.ptr] for a in fake.launches)
  x2 = Buffer(backend, 64, dtypes.f32)
  lg([x2, y], varying=[0])                  # a replay on a new argument: only its slot is handed over
  assert (fake.launches[-1]["args"], fake.launches[-1]["graph"]) == ([x2.handle.ptr, y.handle.ptr], True)
