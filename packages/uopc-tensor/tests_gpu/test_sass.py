"""The SASS of the kernels a first H200 run will time, checked without a GPU: the f16 GEMM 8192 (benchmarks/gpu.py's
row) and the GPT training step's kernels, compiled for sm_90 and read back with cuobjdump (testing/sass.py): the GEMM is
the pipelined tensor-core kernel (HMMA: mma.sync; LDGSTS: its cp.async copies into shared memory; LDSM: its ldmatrix
fragment loads), no kernel spills to local memory, registers and shared memory fit an sm_90 launch (`python
testing/sass.py` prints every count)."""
from __future__ import annotations
import pytest
import sass
from uopc.backends import CompileError
from uopc.backends.cuda import CUDACompiler

TOOL = sass.cuobjdump()


def _compiler() -> str | None:
  try: return CUDACompiler().tool()
  except CompileError: return None


pytestmark = [
  pytest.mark.skipif(TOOL is None, reason="cuobjdump is not installed (pip install nvidia-cuda-cuobjdump, as the cuda nox sessions do): "
                                          "the SASS checks need it"),
  pytest.mark.skipif(_compiler() is None, reason="neither nvcc nor libnvrtc is installed: the SASS checks compile kernels with one of them"),
]


@pytest.mark.skipif(sass.nvdisasm() is None, reason="nvdisasm is not installed (pip install nvidia-cuda-nvdisasm, as the cuda nox sessions do): "
                                                    "cuobjdump -sass needs it")
@pytest.mark.parametrize("out_f32", [True, False], ids=["f32_out", "f16_out"])
def test_the_f16_gemm_8192_is_one_tensor_core_kernel_that_fits_sm_90(out_f32):
  kernels = sass.gemm_8192(out_f32)
  assert len(kernels) == 1, [name for name, _, _ in kernels]
  [(name, src, threads)] = kernels
  k = sass.inspect(name, src, threads, TOOL)
  print(f"\n{sass.HEADER}\n{k.row()}")
  assert k.registers > 0 and sum(k.ops.values()) > 0, f"cuobjdump's output was not read: {k}"
  # each mma.sync of the source is an HMMA.16816 (more where ptxas unrolls a loop around one), each cp.async an LDGSTS, each
  # ldmatrix an LDSM: the operands reach the tensor cores through shared memory, not straight from global memory
  assert k.ops["HMMA"] >= src.count("mma.sync.aligned.m16n8k16") > 0, k.row()
  assert k.ops["LDGSTS"] >= src.count("cp.async.cg.shared.global") > 0, k.row()
  assert k.ops["LDSM"] >= src.count("ldmatrix.sync.aligned") > 0 and k.ops["LDG"] == 0, k.row()
  assert not k.faults(), f"{name}: {k.faults()}"


def test_the_gpt_training_steps_kernels_fit_sm_90_without_spilling():
  kernels = sass.gpt_training_step()
  assert len(kernels) > 20, "the GPT step lowered fewer kernels than it has ops: the recording missed them"
  read = [sass.inspect(name, src, threads, TOOL, sass=False) for name, src, threads in kernels]
  print("\n" + "\n".join([sass.HEADER] + [k.row() for k in read]))
  assert all(k.registers > 0 for k in read), "cuobjdump -res-usage was not read"
  assert any(k.shared for k in read), "no kernel of the step uses shared memory: its block-shared reductions were not lowered for a GPU"
  faults = [f"{k.name}: {f}" for k in read for f in k.faults()]
  assert not faults, faults


def test_the_sass_reader_counts_predicated_instructions_and_every_function():
  """cuobjdump's text as it prints a cubin of two functions: a predicated instruction counts under its own opcode,
  modifiers are dropped, and each function gets its own resources."""
  text = """
 Function second:
  REG:40 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:552 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function first:
  REG:255 STACK:8 SHARED:0 LOCAL:16 CONSTANT[0]:552 TEXTURE:0 SURFACE:0 SAMPLER:0
\t\tFunction : second
        /*0000*/                   LDSM.16.M88.4 R4, [R2] ;                               /* 0x000000000204783b */
        /*0010*/              @!P0 LDGSTS.E.BYPASS.128 [R3], desc[UR4][R8.64] ;            /* 0x0000000008037fae */
        /*0020*/                   HMMA.16816.F32 R20, R4, R6, R20 ;                      /* 0x000000062414723c */
\t\tFunction : first
        /*0000*/               @P1 STL [R1], R2 ;                                         /* 0x0000000201001387 */
        /*0010*/                   LDL R2, [R1] ;                                         /* 0x0000000001027983 */
        /*0020*/                   EXIT ;                                                 /* 0x000000000000794d */
"""
  kernels = sass.parse(text)
  assert kernels["second"].ops == {"LDSM": 1, "LDGSTS": 1, "HMMA": 1} and (kernels["second"].registers, kernels["second"].shared) == (40, 1024)
  first = kernels["first"]
  assert first.spills == 2 and first.local == 24 and first.registers == 255
  first.threads = 512
  assert any("local-memory" in f for f in first.faults()) and any("per block" in f for f in first.faults())
