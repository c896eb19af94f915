"""The SASS of uopc's CUDA kernels, read without a GPU: each kernel compiled for sm_90 (nvcc, else NVRTC: ptxas makes the
SASS either way) and read back with `cuobjdump -res-usage -sass` (a CUDA toolkit's on PATH, else the nvidia-cuda-cuobjdump
wheel's, found as the CUDA backend finds NVRTC in NVIDIA's wheels; -sass runs nvdisasm, from nvidia-cuda-nvdisasm).

    python testing/sass.py [--all]    # the f16 GEMM 8192's kernels and the GPT training step's, one row each

Per kernel: the instructions that say how a GEMM is built (HMMA: tensor-core mma; LDSM: ldmatrix; LDGSTS: cp.async;
LDS/STS: shared memory; LDG/STG: global), local-memory spills (LDL/STL), and the registers per thread and static shared
memory ptxas gave it, beside the dynamic shared memory its launches pass. tests_gpu/test_sass.py asserts what holds; this
script prints the numbers (gpu_check.sh and the cuda nox sessions run it)."""
from __future__ import annotations
import os, re, shutil, subprocess, sys, tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ARCH = "sm_90"
MAX_REGISTERS = 255              # per thread (every architecture since sm_35)
REGISTERS_PER_BLOCK = 65536      # sm_90's register file, all of a block's threads together
MAX_STATIC_SHARED = 48 * 1024    # a block's static shared memory
MAX_SHARED = 227 * 1024          # sm_90's shared memory per block with cuFuncSetAttribute's consent (dynamic included)
SHOWN = ("HMMA", "LDSM", "LDGSTS", "LDS", "STS", "LDG", "STG", "LDL", "STL", "BAR")


@dataclass
class KernelSass:
  """One kernel's SASS, as cuobjdump reads it from a cubin."""
  name: str
  threads: int = 1                       # per block, at launch
  dynamic_shared: int = 0                # bytes passed at launch
  registers: int = 0
  shared: int = 0                        # static bytes (ptxas's)
  local: int = 0                         # bytes of local memory per thread (spills, or arrays ptxas couldn't keep in registers)
  ops: Counter = field(default_factory=Counter)   # opcode (without its modifiers) -> instructions

  @property
  def spills(self) -> int: return self.ops["LDL"] + self.ops["STL"]

  def faults(self) -> list[str]:
    """What would fail or slow a launch: spills, registers or shared memory beyond sm_90's limits."""
    out = []
    if self.spills or self.local: out.append(f"{self.spills} local-memory loads/stores (LDL/STL), {self.local} bytes of local memory")
    if self.registers > MAX_REGISTERS: out.append(f"{self.registers} registers per thread (at most {MAX_REGISTERS})")
    if self.registers * self.threads > REGISTERS_PER_BLOCK:
      out.append(f"{self.registers} registers x {self.threads} threads = {self.registers * self.threads} per block (at most {REGISTERS_PER_BLOCK})")
    if self.shared > MAX_STATIC_SHARED: out.append(f"{self.shared} bytes of static shared memory (at most {MAX_STATIC_SHARED})")
    if self.shared + self.dynamic_shared > MAX_SHARED:
      out.append(f"{self.shared} + {self.dynamic_shared} bytes of shared memory (at most {MAX_SHARED})")
    return out

  def row(self) -> str:
    return (f"{self.name[:34]:<35}" + "".join(f"{self.ops[op] if self.ops else '-':>7}" for op in SHOWN) +
            f"{self.registers:>6}{self.shared + self.dynamic_shared:>8}{self.threads:>6}")


HEADER = f"{'kernel':<35}" + "".join(f"{op:>7}" for op in SHOWN) + f"{'regs':>6}{'shared':>8}{'thr':>6}"


def _tool(name: str) -> str | None:
  """A CUDA binary tool: a CUDA toolkit's on PATH, else a pip wheel's (nvidia/cu13/bin); None."""
  if found := shutil.which(name): return found
  from uopc.backends.cuda import _pip_cuda_dirs
  for folder in _pip_cuda_dirs("bin"):
    if os.access(folder / name, os.X_OK): return str(folder / name)
  return None


def cuobjdump() -> str | None:
  """cuobjdump (the nvidia-cuda-cuobjdump wheel's, where no toolkit's is on PATH), or None."""
  return _tool("cuobjdump")


def nvdisasm() -> str | None:
  """nvdisasm, which `cuobjdump -sass` runs to disassemble (the nvidia-cuda-nvdisasm wheel's, where no toolkit's is on
  PATH), or None."""
  return _tool("nvdisasm")


_RESOURCES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")
_FUNCTION = re.compile(r"^\s*Function : (\S+)\s*$")
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T\d]+\s+)?([A-Z][A-Z0-9_]*)")


def read_cubin(cubin: bytes, tool: str, sass: bool = True) -> dict[str, KernelSass]:
  """Every function of a cubin: its resources (cuobjdump -res-usage: a few milliseconds) and, with `sass`, its
  instruction counts (-sass: about half a second of disassembly per cubin)."""
  with tempfile.TemporaryDirectory(prefix="uopc-sass-") as tmp:
    path = Path(tmp) / "kernel.cubin"
    path.write_bytes(cubin)
    env = dict(os.environ)
    if sass and (disassembler := nvdisasm()) is not None: env["NVDISASM_PATH"] = str(Path(disassembler).parent)   # a wheel's: not on PATH
    proc = subprocess.run([tool, "-res-usage", *(["-sass"] if sass else []), str(path)], capture_output=True, text=True, timeout=120, env=env)
  if proc.returncode != 0: raise RuntimeError(f"{tool} failed (status {proc.returncode}): {proc.stderr.strip()}")
  return parse(proc.stdout)


def parse(text: str) -> dict[str, KernelSass]:
  """cuobjdump's -res-usage (and -sass) text: each function's resources and instruction counts."""
  kernels = {m[1]: KernelSass(m[1], registers=int(m[2]), shared=int(m[4]), local=int(m[3]) + int(m[5]))
             for m in _RESOURCES.finditer(text)}
  current = None
  for line in text.splitlines():
    if m := _FUNCTION.match(line): current = kernels.setdefault(m[1], KernelSass(m[1]))
    elif current is not None and (m := _INSTRUCTION.match(line)): current.ops[m[1]] += 1
  return kernels


_COMPILER = None


def inspect(name: str, src: str, threads: int, tool: str, sass: bool = True) -> KernelSass:
  """A rendered CUDA kernel compiled for sm_90 and read back (its instructions counted only with `sass`)."""
  global _COMPILER
  from uopc.backends.cuda import CUDACompiler, dynamic_shared_bytes
  if _COMPILER is None: _COMPILER = CUDACompiler()      # one: it asks nvcc its version once
  kernels = read_cubin(_COMPILER.compile(src, name, ARCH), tool, sass)
  if name not in kernels: raise RuntimeError(f"{name} is not among the cubin's functions {sorted(kernels)}")
  kernel = kernels[name]
  kernel.threads, kernel.dynamic_shared = threads, dynamic_shared_bytes(src)
  return kernel


def gemm_8192(out_f32: bool) -> list[tuple[str, str, int]]:
  """(name, CUDA source, threads per block) of each kernel of the f16 8192 x 8192 x 8192 GEMM on the CUDA backend:
  a.float() @ b.float() (f32 out), or a @ b (f16 out, as benchmarks/gpu.py and torch.matmul run it). Operands without
  data: only the kernels are made (rendered and compiled for the device's arch, else $UOPC_CUDA_ARCH, else sm_90)."""
  from uopc import runtime
  from uopc.backends import get_backend
  from uopc.dtype import dtypes
  from uopc.tensor import Tensor
  from uopc.tensor.storage import new_buffer
  n = 8192
  a, b = (Tensor(new_buffer(n * n, dtypes.f16).reshape((n, n)), device="CUDA") for _ in range(2))
  programs = [runtime.compile_kernel(k, get_backend("CUDA")) for k in ((a.float() @ b.float()) if out_f32 else a @ b).schedule()]
  return [(p.name, p.src, _product(p.local_size)) for p in programs]


def gpt_training_step() -> list[tuple[str, str, int]]:
  """(name, CUDA source, threads per block) of each kernel of a tiny uopc.gpt's training step (forward, backward,
  AdamW), lowered for a GPU: recorded from a step on the PYTHON backend (the GPU emulator) and rendered for CUDA."""
  from uopc import runtime
  from uopc.backends.cuda import CUDARenderer
  from uopc.backends.python import PythonBackend
  from uopc.uop import AxisType, Ops
  from tiny_gpt import tiny_gpt_step
  seen, original, programs = [], PythonBackend.compile, runtime._programs
  def record(self, program, name):
    seen.append(program)
    return original(self, program, name)
  PythonBackend.compile, runtime._programs = record, runtime.ProgramCache(1024)   # a fresh cache: every kernel is compiled
  try: tiny_gpt_step("PYTHON")
  finally: PythonBackend.compile, runtime._programs = original, programs
  renderer, unique = CUDARenderer(), {}
  for p in seen:
    threads = _product(int(u.src[0].arg) for u in p.uops if u.op is Ops.RANGE and u.arg.kind is AxisType.LOCAL)
    src = renderer.render(p)
    unique.setdefault(src, (p.name, src, threads))
  return list(unique.values())


def _product(xs) -> int:
  out = 1
  for x in xs or (): out *= int(x)
  return out


def main() -> int:
  every = "--all" in sys.argv[1:]
  tool = cuobjdump()
  if tool is None or nvdisasm() is None:
    print("testing/sass.py: cuobjdump and nvdisasm are needed (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm, or a CUDA "
          f"toolkit on PATH); found cuobjdump: {tool}, nvdisasm: {nvdisasm()}")
    return 1
  print(f"SASS for {ARCH} ({tool}); counts are instructions in the code, not executed ones; the GPT step's only with --all "
        "(else '-': its registers, shared and local memory are read, not its instructions)")
  print(HEADER)
  failed = 0
  for title, kernels, sass in (("f16 GEMM 8192, f32 out (a.float() @ b.float())", gemm_8192(True), True),
                                ("f16 GEMM 8192, f16 out (a @ b)", gemm_8192(False), True), ("GPT training step", gpt_training_step(), every)):
    print(f"-- {title}: {len(kernels)} kernel(s)")
    for name, src, threads in kernels:
      k = inspect(name, src, threads, tool, sass)
      print(k.row() + ("".join(f"  !! {f}" for f in k.faults())))
      failed += bool(k.faults())
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
