"""The GPU suite: Tensor programs lowered for a GPU (Opts(gpu=True): threads, shared memory, barriers, tensor cores),
run on the PYTHON backend (NumPy emulation of the grid, with race checks) against NumPy, every kernel they need
compiled by nvcc for $UOPC_CUDA_ARCH (default sm_90), and run on a CUDA device where there is one (compiled for the
device's own architecture).

`nox -s "cuda(arch='sm_90')"` runs it; each workload below is one row of the suite."""
from __future__ import annotations
import os
import shutil
import numpy as np
import pytest
from uopc.tensor import Tensor
from uopc import nn
from uopc.backends import LinearProgram, get_backend
from uopc.backends.python import PythonBackend
from uopc.backends import cuda
from uopc.backends.cuda import CUDACompiler, CUDARenderer, device_available
from tiny_gpt import on_device, tiny_gpt_step
import nvcc_batch

ARCH = os.environ.get("UOPC_CUDA_ARCH", "sm_90")


def rand(seed: int, *shape, dtype=np.float32) -> np.ndarray:
  return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


# ---- workloads: (what uopc computes on `device`, what NumPy says), each a row of the suite ---------------------------

def elementwise(device):
  a, b = rand(0, 33, 70), rand(1, 70)
  out = ((Tensor(a, device=device) * 2 - Tensor(b, device=device)).exp2().sqrt() + 1).numpy()
  return out, np.sqrt(np.exp2(a * 2 - b)) + 1, 1e-5


def broadcast_where(device):
  a, b = rand(2, 4, 1, 6), rand(3, 5, 1)
  ta, tb = Tensor(a, device=device), Tensor(b, device=device)
  return (ta > tb).where(ta, tb * 3).numpy(), np.where(a > b, a, b * 3), 0


def half_math(device):
  a = np.abs(rand(19, 40, 24, dtype=np.float16)) + np.float16(0.5)
  t = Tensor(a, device=device)
  out = (t * 2 + 1).sqrt().maximum(t).exp2().float().numpy()
  return out, np.exp2(np.maximum(np.sqrt(a * 2 + 1), a)).astype(np.float32), 5e-3


def integer_math(device):
  i = np.arange(-40, 40, dtype=np.int32).reshape(8, 10)
  t = Tensor(i, device=device)
  out = ((t // 3 + t % 7) * (t < 5).cast(t.dtype) + t.maximum(-3)).numpy()
  return out, ((i // 3 + i % 7) * (i < 5) + np.maximum(i, -3)).astype(np.int32), 0


def row_sums(device):
  a = rand(4, 48, 256)
  return Tensor(a, device=device).sum(-1).numpy(), a.sum(-1), 1e-4


def column_max(device):
  a = rand(5, 300, 40)
  return Tensor(a, device=device).max(0).numpy(), a.max(0), 0


def long_sum(device):
  a = rand(6, 1 << 16)
  return Tensor(a, device=device).sum().numpy(), a.sum(dtype=np.float64), 1e-3


def nested_sums(device):
  # a reduction inside another: (x @ x).sum(1), a per-thread sum at each element of a block-shared one
  a = rand(7, 64, 64)
  t = Tensor(a, device=device)
  return (t @ t).sum(1).numpy(), (a @ a).sum(1), 1e-3


def softmax(device):
  a = rand(8, 24, 200) * 4
  e = np.exp(a - a.max(-1, keepdims=True))
  return Tensor(a, device=device).softmax(-1).numpy(), e / e.sum(-1, keepdims=True), 1e-6


def gemm_f32(device):
  a, b = rand(9, 128, 96), rand(10, 96, 64)
  return (Tensor(a, device=device) @ Tensor(b, device=device)).numpy(), a @ b, 1e-4


def gemm_f32_fused(device):
  # bias and ReLU after the GEMM, and a batch axis: the staged GEMM's operands are expressions, not buffers
  a, b, bias = rand(11, 2, 64, 48), rand(12, 48, 64), rand(13, 64)
  out = (Tensor(a, device=device) @ Tensor(b, device=device) + Tensor(bias, device=device)).relu().numpy()
  return out, np.maximum(a @ b + bias, 0), 1e-4


def gemm_f16(device):
  # f16 operands, products summed in f32: tensor cores (WMMA m16n8k16) on a GPU that has them
  a, b = rand(14, 64, 128, dtype=np.float16), rand(15, 128, 64, dtype=np.float16)
  out = (Tensor(a, device=device).float() @ Tensor(b, device=device).float()).numpy()
  return out, a.astype(np.float32) @ b.astype(np.float32), 1e-3


def gemm_half(device):
  # a.half() @ b.half(): Tensor.matmul sums f16 products in f32 and rounds the result to f16, the same tensor-core GEMM
  a, b = rand(18, 64, 128, dtype=np.float16), rand(19, 128, 64, dtype=np.float16)
  out = (Tensor(a, device=device).half() @ Tensor(b, device=device).half()).numpy()
  assert out.dtype == np.float16
  return out.astype(np.float32), (a.astype(np.float32) @ b.astype(np.float32)).astype(np.float16).astype(np.float32), 1e-3


def tc_gemm(m: int, n: int, k: int, seed: int):
  """An f16 GEMM of m x k by k x n summed in f32: tensor cores, in blocks of 64x64 outputs (or smaller where the sizes
  ask), so the sizes below take many blocks along each axis, and the block and warp offsets of the indices are tested."""
  def workload(device):
    a, b = rand(seed, m, k, dtype=np.float16), rand(seed + 1, k, n, dtype=np.float16)
    out = (Tensor(a, device=device).float() @ Tensor(b, device=device).float()).numpy()
    return out, a.astype(np.float32) @ b.astype(np.float32), 1e-3
  workload.__name__ = f"gemm_f16_{m}x{n}x{k}"
  return workload


gemm_f16_1024 = tc_gemm(1024, 1024, 1024, 30)
gemm_f16_wide = tc_gemm(256, 512, 192, 32)
gemm_f16_long = tc_gemm(128, 2048, 64, 34)


def conv(device):
  x, w = rand(16, 2, 8, 10, 10), rand(17, 16, 8, 3, 3)
  out = Tensor(x, device=device).conv2d(Tensor(w, device=device), padding=1).numpy()
  xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
  ref = np.zeros((2, 16, 10, 10), np.float32)
  for i in range(3):
    for j in range(3): ref += np.einsum("nchw,oc->nohw", xp[:, :, i:i + 10, j:j + 10], w[:, :, i, j])
  return out, ref, 1e-4


def jitted_replays(device):
  """A jitted function of three kernels replayed on six new inputs: from its third call a replay goes through the
  backend's launch graph (on CUDA, one CUDA graph whose nodes are given each call's new input and output), and every
  call's answer must be its own input's."""
  from uopc.jit import jit
  w = rand(21, 48, 32)
  tw = Tensor(w, device=device)
  f = jit(lambda x: ((x @ tw).relu().sum(1) + (x * x).sum(1), (x - 1).exp2()))
  xs = [rand(22 + i, 16, 48) for i in range(6)]
  got = [np.concatenate([o.numpy().ravel() for o in f(Tensor(x, device=device))]) for x in xs]
  want = [np.concatenate([(np.maximum(x @ w, 0).sum(1) + (x * x).sum(1)).ravel(), np.exp2(x - 1).ravel()]) for x in xs]
  return np.stack(got), np.stack(want), 1e-4


def mlp_training_step(device):
  """Two steps of a 32-64-10 MLP with AdamW; the oracle is the same steps on the C backend (checked against NumPy and
  PyTorch elsewhere)."""
  def train(dev):
    with on_device(dev):
      Tensor.manual_seed(0)
      l1, l2 = nn.Linear(32, 64), nn.Linear(64, 10)
      opt = nn.AdamW([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.01)
      x, y = rand(18, 16, 32), (np.arange(16) % 10).astype(np.int32)
      for _ in range(2):
        opt.zero_grad()
        loss = l2(l1(Tensor(x)).relu()).cross_entropy(Tensor(y))
        loss.backward()
        opt.step()
      return np.concatenate([loss.numpy().reshape(1), l1.weight.numpy().ravel(), l2.bias.numpy()])
  return train(device), train("C"), 1e-5


def gpt_training_step(device):
  """A training step of a tiny uopc.gpt (testing/tiny_gpt.py); the oracle is the same step on the C backend."""
  return tiny_gpt_step(device), tiny_gpt_step("C"), 1e-5


WORKLOADS = [elementwise, broadcast_where, half_math, integer_math, row_sums, column_max, long_sum, nested_sums, softmax, gemm_f32, gemm_f32_fused,
             gemm_f16, gemm_half, gemm_f16_1024, gemm_f16_wide, gemm_f16_long, conv, jitted_replays, mlp_training_step, gpt_training_step]
DEVICES = ["PYTHON", pytest.param("CUDA", marks=pytest.mark.skipif(not device_available(), reason="no CUDA device on this machine"))]


@pytest.fixture
def recorded(monkeypatch):
  """The LinearPrograms the PYTHON backend compiles during a test."""
  seen: list[LinearProgram] = []
  original = PythonBackend.compile
  def compile_and_record(self, program, name):
    seen.append(program)
    return original(self, program, name)
  monkeypatch.setattr(PythonBackend, "compile", compile_and_record)
  from uopc import runtime
  monkeypatch.setattr(runtime, "_programs", {})        # compile again, so that this test sees every kernel it needs
  return seen


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.__name__)
def test_workload_matches_numpy(workload, device):
  got, want, tol = workload(device)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def test_the_gpu_lowerings_are_the_ones_this_suite_means_to_check(recorded):
  """The suite reaches every GPU shape of kernel: threads per element, block-shared reductions, staged GEMM tiles and
  tensor cores (a heuristic change that drops one would leave it untested)."""
  for w in (row_sums, gemm_f32, elementwise): w("PYTHON")
  ops = {u.op.name for p in recorded for u in p.uops}
  assert "BARRIER" in ops and "WMMA" not in ops
  assert any(u.op.name == "ALLOC" and u.addrspace is not None and u.addrspace.name == "SHARED" for p in recorded for u in p.uops)
  for w in (gemm_f16, gemm_half, gemm_f16_1024, gemm_f16_wide, gemm_f16_long):
    recorded.clear()
    w("PYTHON")
    assert any(u.op.name == "WMMA" for p in recorded for u in p.uops), f"{w.__name__} did not reach the tensor cores"
    if w in (gemm_f16_1024, gemm_f16_wide, gemm_f16_long):
      # the pipelined kernel (cp.async copies, ldmatrix) in many blocks along both output axes (a GLOBAL range each: the
      # block offsets are in every index), but 128 x 2048, one row of 128 x 128 blocks
      [p] = recorded
      assert {"ASYNC_COPY", "ASYNC_WAIT", "LDMATRIX"} <= {u.op.name for u in p.uops}, f"{w.__name__} is not the pipelined GEMM"
      blocks = [int(u.src[0].arg) for u in p.uops if u.op.name == "RANGE" and u.arg.kind.name == "GLOBAL"]
      assert (blocks == [16]) if w is gemm_f16_long else (len(blocks) == 2 and min(blocks) > 1), (w.__name__, blocks)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed: the CUDA compile checks need it")
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.__name__)
def test_every_kernel_of_the_workload_compiles_with_nvcc(workload, recorded, tmp_path):
  workload("PYTHON")
  assert recorded, "the workload compiled no kernel"
  renderer = CUDARenderer()
  # in one nvcc run (testing/nvcc_batch.py: 61 s for the GPT step's 99 kernels one run each); on a failure each alone,
  # so that the failure names its kernel
  sources = [(renderer.render(program), program.name) for program in recorded]
  proc, cubin, names = nvcc_batch.nvcc_all(sources, ARCH, tmp_path)
  if proc.returncode != 0:
    for src, name in sources: CUDACompiler._nvcc(src, ARCH)
    pytest.fail(f"nvcc failed on the kernels together, not on any alone:\n{proc.stderr}")
  assert cubin[:4] == b"\x7fELF", "nvcc produced no cubin"
  for name in names: assert name.encode() in cubin, f"{name}: not in the cubin nvcc built"


@pytest.mark.skipif(cuda._nvrtc() is None, reason="libnvrtc is not installed (pip install nvidia-cuda-nvrtc): the NVRTC compile checks need it")
@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.__name__)
def test_every_kernel_of_the_workload_compiles_with_nvrtc(workload, recorded):
  # NVRTC called directly: the compiler prefers nvcc where both are present
  workload("PYTHON")
  assert recorded, "the workload compiled no kernel"
  renderer = CUDARenderer()
  for program in recorded:
    assert CUDACompiler._nvrtc(renderer.render(program), program.name, ARCH)[:4] == b"\x7fELF", f"{program.name}: NVRTC produced no cubin"


@pytest.mark.parametrize("n", [1024, 2048, 8192])
def test_an_f16_gemm_at_benchmark_sizes_reaches_the_tensor_cores_on_cuda(n, monkeypatch):
  """The kernels of a.float() @ b.float() (f16 n x n) on the CUDA backend, rendered (the compiler is faked: no cubin, no
  launch): one kernel of mma.sync. kernelize used to pack B for every backend at 2048 and above, and the CUDA kernel was
  then a CUDA-core GEMM of an f32 copy."""
  from uopc import runtime
  from uopc.dtype import dtypes
  from uopc.tensor.storage import new_buffer
  monkeypatch.setattr(runtime, "_programs", runtime.ProgramCache(64))        # the faked programs stay in this test
  monkeypatch.setattr(CUDACompiler, "compile", lambda self, src, name, arch: b"\x7fELF (not compiled)")
  a, b = (Tensor(new_buffer(n * n, dtypes.f16).reshape((n, n)), device="CUDA") for _ in range(2))
  kernels = (a.float() @ b.float()).schedule()
  sources = [runtime.compile_kernel(k, get_backend("CUDA")).src for k in kernels]
  assert len(sources) == 1 and "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in sources[0], [k.root.shape for k in kernels]


def test_the_cuda_backend_without_a_device_renders_compiles_and_says_why_it_cant_run():
  if device_available(): pytest.skip("a CUDA device is present: the no-device error can't be seen here")
  from uopc.backends.cuda import NoDeviceError
  backend = get_backend("CUDA")
  assert backend.caps.gpu
  with pytest.raises(NoDeviceError, match="no CUDA device was found"): backend.alloc(4, Tensor([1.0]).dtype)
  with pytest.raises(NoDeviceError, match="no CUDA device was found"): Tensor(np.ones(3, np.float32), device="CUDA").numpy()
