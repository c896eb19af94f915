"""The CUDA backend: kernels rendered as CUDA C++, compiled by nvcc (or NVRTC) to a cubin, run through the driver API.

    CUDARenderer().render(program)   -> `extern "C" __global__ void name(float* __restrict__ data0, ...)`
    get_backend("CUDA")              -> renders and compiles anywhere nvcc is; allocates and launches where a GPU is

The renderer is the C renderer with a handful of table entries changed: the kernel prefix, `__restrict__`, the grid
coordinates (GLOBAL ranges from blockIdx.x, LOCAL ones from threadIdx.x, as uopc.backends lays the grid out: the first
range is the most significant digit of the flat block or thread number), shared memory as pieces of one dynamic
`extern __shared__` block (its size, written in the source, is passed at each launch, and a kernel over 48 KiB is
allowed it with cuFuncSetAttribute), `__syncthreads()`, `half` for f16 (cuda_fp16.h), 16-byte vector loads and stores
(float4, int4, half8: what uopc.vectorize folds neighbouring accesses into, Caps.vector_bytes; then 8 and 4 bytes:
float2, int2, half4, half2), and WMMA as the inline
PTX of mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (sm_80 and later): a lane's 8 halves of A and 4 of B are
packed two to a 32-bit register, low element first (uopc_pack; the registers an ldmatrix filled go as they are).

Compilation: nvcc -cubin for the target architecture (the device's own compute capability; on a machine without a
GPU, $UOPC_CUDA_ARCH, else sm_90), --fmad=false (a*b+c is never contracted: the IR's MULACC says where a fused
multiply-add is wanted, as in the C backend), cached on disk like the C backend's shared objects (content-addressed,
atomic, sealed with a checksum). Where nvcc is missing and libnvrtc is present (the system's, or the nvidia-cuda-nvrtc
wheel's), NVRTC compiles instead; a kernel with f16 values also needs cuda_fp16.h (a CUDA toolkit's, or the
nvidia-cuda-runtime wheel's).

The runtime is ctypes over libcuda (cuInit, the primary context, cuMemAlloc, cuMemcpy, cuModuleLoadData,
cuLaunchKernel, cuCtxSynchronize): no CUDA Python package. The driver keeps a current context per thread, so every
entry point makes the primary context current in the thread that calls it (a Buffer the garbage collector frees in
another thread included); a free that fails is a warning (it runs in a finalizer, where an exception reaches no one).
The driver must support the toolkit's CUDA major version (cuDriverGetVersion), or the first use of the device says
which driver and which toolkit. A kernel's fault shows in the next call that waits; under UOPC_CUDA_SYNC=1 or
UOPC_DEBUG>=1 each launch waits for its kernel, and a fault names it. On a machine without a GPU (or without the
driver), the backend still renders and compiles, so every kernel can be checked with nvcc, and alloc or launch raises
NoDeviceError, which says why no device was found. Tests replace libcuda with a stand-in (_load_libcuda;
testing/fake_libcuda.py).
"""
from __future__ import annotations
import ctypes, functools, hashlib, importlib.util, math, os, re, shutil, subprocess, tempfile, threading, warnings
from dataclasses import dataclass
from pathlib import Path
import numpy as np
from uopc.uop import UOp, Ops, AxisType
from uopc.dtype import AddrSpace, DType, dtypes
from uopc.opt import Caps
from uopc.compile_cache import cache_dir, read_entry, write_entry
from uopc.backends import BackendError, CompileError, LinearProgram
from uopc.runtime import debug_level
from uopc.backends.c import CCompiler, CRenderer, _array, sanitize_name, shared_layout
from uopc.backends.cprelude import EXP2_POLY, exp2_horner, FLOORDIV_I32, FLOORMOD_I32, CAST_F32_I32, used_helpers


class NoDeviceError(BackendError):
  """The CUDA backend was asked for memory or a launch where there is no GPU (or no driver)."""


# the prelude's pieces (see uopc.backends.c.used_helpers): a kernel's prelude holds those its code uses
EXP2_CUDA = f"""__device__ static inline float uopc_exp2(float x) {{   /* the C backend's uopc_exp2, operation for operation */
  x = x < -160.0f ? -160.0f : x; x = x > 160.0f ? 160.0f : x;
  float t = (x + 12582912.0f) - 12582912.0f, f = x - t, p = {repr(EXP2_POLY[-1])}f;{exp2_horner("fmaf")}
  int n = t == t ? (int)t : 0, a = n >> 1, b = n - a;
  return (p * __int_as_float((a + 127) << 23)) * __int_as_float((b + 127) << 23);
}}
"""
# eight halves in 16 bytes: CUDA has float4 and int4, and for f16 only half2, so a half8 is four of them (a half4 two)
HALF8 = """struct __align__(16) half8 { half2 x, y, z, w; };
__device__ static inline half8 make_half8(half a, half b, half c, half d, half e, half f, half g, half h) {
  half8 r; r.x = __halves2half2(a, b); r.y = __halves2half2(c, d); r.z = __halves2half2(e, f); r.w = __halves2half2(g, h); return r;
}
"""
HALF4 = """struct __align__(8) half4 { half2 x, y; };
__device__ static inline half4 make_half4(half a, half b, half c, half d) {
  half4 r; r.x = __halves2half2(a, b); r.y = __halves2half2(c, d); return r;
}
"""
# INFINITY and NAN by their bits: NVRTC has no math.h, and nvcc's (included before the kernel) defines them already, so
# they are undefined first (a redefinition was a warning on every nvcc compile)
HELPERS = [
  (r"\bINFINITY\b", "#undef INFINITY\n#define INFINITY (__int_as_float(0x7f800000))\n"),
  (r"\bNAN\b", "#undef NAN\n#define NAN (__int_as_float(0x7fffffff))\n"),
  (r"\bhalf8\b", HALF8), (r"\bhalf4\b", HALF4),
  (r"\buopc_pack\b", "__device__ static inline unsigned uopc_pack(half a, half b) { half2 h = __halves2half2(a, b); return *(unsigned*)&h; }\n"),
  (r"\bfloordiv_i32\b", "__device__ " + FLOORDIV_I32), (r"\bfloormod_i32\b", "__device__ " + FLOORMOD_I32),
  (r"\bcast_f32_i32\b", "__device__ " + CAST_F32_I32), (r"\buopc_exp2\b", EXP2_CUDA),
]


_VECTORS = {dtypes.f32.vec(4): "float4", dtypes.i32.vec(4): "int4", dtypes.f16.vec(8): "half8",
            dtypes.f32.vec(2): "float2", dtypes.i32.vec(2): "int2", dtypes.f16.vec(4): "half4", dtypes.f16.vec(2): "half2"}


def _cuda_vector(d: DType) -> str:
  """The CUDA type of a vector of 16, 8 or 4 bytes: float4, int4, half8; float2, int2, half4; half2."""
  name = _VECTORS.get(d)
  if name is None: raise BackendError(f"CUDA kernels move vectors of 16, 8 or 4 bytes ({', '.join(_VECTORS.values())}), not {d.name}")
  return name


class CUDARenderer(CRenderer):
  """CUDA C++ from the C renderer's tables (see the module docstring)."""
  kernel_prefix = 'extern "C" __global__ void'
  buffer_qualifier = " __restrict__"
  barrier = "__syncthreads();"
  half = "half"
  chain_pragma = scalar_loop_pragma = math_pragma = ""   # nvcc has its own code generator: the C backend's gcc pragmas mean nothing to it
  long_tile_index = False             # (nor its -Og: a GPU kernel's indices stay ints)
  prefetch_bytes = 0                  # nor does its __builtin_prefetch (a GPU hides latency with other warps)
  stream_min_bytes = 0                # nor its stores past the caches
  vector_code_for_op: dict = {}       # no arithmetic on vectors: threads are the lanes, vectors only move memory
  helpers = HELPERS
  # shared memory is one dynamic block (uopc_shared) that every shared ALLOC is a piece of, at its offset in
  # shared_layout: a block may then hold more than the 48 KiB that static __shared__ arrays are limited to. Each piece is
  # 16-byte aligned, so that a vector of it (uopc.vectorize proves its index a multiple of the vector's lanes) is aligned
  alloc_code = {AddrSpace.LOCAL: _array,
                AddrSpace.SHARED: lambda ctype, name, n, offset: f"{ctype}* {name} = ({ctype}*)(uopc_shared + {offset});"}

  def type_name(self, d: DType) -> str:
    if d.count > 1: return _cuda_vector(d)
    return "bool" if d is dtypes.bool else super().type_name(d)   # C++, not C's _Bool

  # vectors are 16 bytes of memory moved at once (uopc.vectorize with Caps.vector_bytes=16, aligned): float4, int4, half8
  def render_vectorize(self, d: DType, xs: list[str]) -> str:
    return f"__halves2half2({', '.join(xs)})" if d == dtypes.f16.vec(2) else f"make_{_cuda_vector(d)}({', '.join(xs)})"
  def render_gep(self, x: str, d: DType, lane: int | str) -> str:
    if d == dtypes.f16.vec(2): return f"{x}.{'xy'[int(lane)]}"
    if d.scalar() is dtypes.f16: return f"{x}.{'xyzw'[int(lane) // 2]}.{'xy'[int(lane) % 2]}"
    return f"{x}.{'xyzw'[int(lane)]}"
  def vector_load(self, mem: str, at: str, d: DType) -> str: return f"(*(({_cuda_vector(d)}*)({mem}+{at})))"
  def vector_store(self, mem: str, at: str, d: DType, value: str) -> list[str]: return [f"*(({_cuda_vector(d)}*)({mem}+{at})) = {value};"]

  def grid_index(self, kind: AxisType, dim: int, sizes: list[int]) -> str:
    flat = "blockIdx.x" if kind is AxisType.GLOBAL else "threadIdx.x"
    below = 1
    for s in sizes[dim + 1:]: below *= s
    q = flat if below == 1 else f"({flat}/{below})"
    return q if dim == 0 else f"({q}%{sizes[dim]})"

  def render_cast(self, x: UOp, to: DType, xs: str) -> str:
    # half converts to and from float only: anything else goes through float
    if x.dtype is dtypes.f16 and to not in (dtypes.f32, dtypes.f16): return super().render_cast(x, to, f"((float){xs})")
    if to is dtypes.f16 and x.dtype is not dtypes.f32 and x.op is not Ops.CONST: return f"((half)((float)({xs})))"
    return super().render_cast(x, to, xs)

  def render_wmma(self, body, u: UOp) -> None:
    a, b, c = (body.stacks[s] for s in u.src)
    if (len(a), len(b), len(c)) != (8, 4, 4) or u.src[0].dtype is not dtypes.f16 or u.src[2].dtype is not dtypes.f32:
      raise BackendError("WMMA here is m16n8k16 with f16 inputs and f32 accumulators: (8 x f16, 4 x f16, 4 x f32) per lane")
    name = f"wmma{body.counter['v']}"
    body.counter["v"] += 1
    body.r[u] = name
    pad = body.pad()
    pairs = [(a[i], a[i + 1]) for i in range(0, 8, 2)] + [(b[i], b[i + 1]) for i in range(0, 4, 2)]
    body.lines.append(f"{pad}float {name}[4];")
    # each 32-bit register two halves, low element first: a register an ldmatrix filled as it is, others packed
    regs = [body.registers.get(p) or f"uopc_pack({p[0]}, {p[1]})" for p in pairs]
    body.lines.append(f"{pad}{{ const unsigned _r[6] = {{{', '.join(regs)}}};")
    body.lines.append(f'{pad}  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, '
                      f'{{%10,%11,%12,%13}};"')
    body.lines.append(f'{pad}    : "=f"({name}[0]), "=f"({name}[1]), "=f"({name}[2]), "=f"({name}[3])')
    body.lines.append(f'{pad}    : "r"(_r[0]), "r"(_r[1]), "r"(_r[2]), "r"(_r[3]), "r"(_r[4]), "r"(_r[5]), '
                      f'"f"({c[0]}), "f"({c[1]}), "f"({c[2]}), "f"({c[3]})); }}')

  def render_async(self, body, u: UOp) -> None:
    """cp.async (16 bytes, L2 only: .cg; a source size of 0 where the copy is not valid fills zeros and reads nothing), its
    commit and wait, and ldmatrix (.x1/.x2/.x4, .trans), as inline PTX; shared addresses through __cvta_generic_to_shared."""
    pad = body.pad()
    if u.op is Ops.ASYNC_COPY:
      (dm, di), (sm, si) = body.wide[u.src[0]], body.wide[u.src[1]]
      body.lines.append(f'{pad}asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"((unsigned)__cvta_generic_to_shared({dm}+{di})), '
                        f'"l"({sm}+{si}), "r"(({body.r[u.src[2]]}) ? 16 : 0) : "memory");')
    elif u.op is Ops.ASYNC_COMMIT: body.lines.append(f'{pad}asm volatile("cp.async.commit_group;" ::: "memory");')
    elif u.op is Ops.ASYNC_WAIT: body.lines.append(f'{pad}asm volatile("cp.async.wait_group {int(u.arg)};" ::: "memory");')
    else:
      n, trans = u.arg
      mem, at = body.wide[u.src[0]]
      name = f"ldm{body.counter['v']}"
      body.counter["v"] += 1
      outs = ", ".join(f'"=r"({name}[{q}])' for q in range(n))
      regs = ",".join(f"%{q}" for q in range(n))
      body.lines.append(f"{pad}unsigned {name}[{n}];")
      body.lines.append(f'{pad}asm volatile("ldmatrix.sync.aligned.m8n8.x{n}{".trans" if trans else ""}.shared.b16 {{{regs}}}, [%{n}];" : {outs} '
                        f': "r"((unsigned)__cvta_generic_to_shared({mem}+{at})));')
      halves = []
      for q in range(n):
        lo, hi = f"__ushort_as_half((unsigned short)({name}[{q}]))", f"__ushort_as_half((unsigned short)({name}[{q}] >> 16))"
        halves += [lo, hi]
        body.registers[(lo, hi)] = f"{name}[{q}]"
      body.stacks[u] = halves

  def prelude(self, program: LinearProgram, code: str) -> str:
    # half comes from cuda_fp16.h, which NVRTC finds only in a toolkit's (or a pip wheel's) headers: included where used
    half = any(u.dtype.scalar() is dtypes.f16 for u in program.uops)
    _, shared = shared_layout(program.uops)
    # the size is written where the backend reads it (dynamic_shared_bytes): a launch passes it, and over 48 KiB the
    # kernel is allowed it first (cuFuncSetAttribute)
    smem = f"{SHARED_LINE.format(shared)}\nextern __shared__ __align__(16) unsigned char uopc_shared[];\n" if shared else ""
    return ("#include <cuda_fp16.h>\n" if half else "") + used_helpers(self.helpers, code) + smem

  def signature(self, program: LinearProgram) -> str:
    threads = 1
    for u in program.uops:
      if u.op is Ops.RANGE and u.arg.kind is AxisType.LOCAL: threads *= int(u.src[0].arg)
    return super().signature(program).replace(self.kernel_prefix, f"{self.kernel_prefix} __launch_bounds__({threads})", 1)


# ---- compiling: nvcc (or NVRTC) to a cubin, cached on disk ----------------------------------------------------------

NVCC_FLAGS = ["-cubin", "-O3", "--fmad=false", "-std=c++17"]
SHARED_LINE = "/* dynamic shared memory: {} bytes */"      # the prelude's line that says how much a launch passes
MAX_STATIC_SHARED = 48 * 1024                               # a block's shared memory without cuFuncSetAttribute's consent


def dynamic_shared_bytes(src: str) -> int:
  """The bytes of dynamic shared memory a rendered kernel's launches pass (the prelude's SHARED_LINE; 0 without one)."""
  m = re.search(re.escape(SHARED_LINE).replace(r"\{\}", r"(\d+)"), src)
  return int(m.group(1)) if m else 0


def default_arch() -> str:
  """The architecture kernels are compiled for: the device's own (an sm_80 cubin does not load on an sm_90 device),
  else $UOPC_CUDA_ARCH (compiling on a machine without a GPU, as the GPU suite's compile checks do), else sm_90 (an
  H100/H200)."""
  try: return _driver().arch
  except BackendError: pass
  return os.environ.get("UOPC_CUDA_ARCH", "").strip() or "sm_90"


@dataclass
class CUDAProgram:
  name: str
  src: str
  arch: str
  cubin: bytes
  shared_bytes: int = 0                     # dynamic shared memory per block, passed at each launch
  function: ctypes.c_void_p | None = None   # the loaded CUfunction, once a launch needs it


def _run_nvcc(src: str, arch: str, workdir: Path) -> tuple[subprocess.CompletedProcess, bytes]:
  """nvcc as the backend runs it (NVCC_FLAGS, for `arch`) on `src` in `workdir`: the finished process and the cubin
  (b"" when it failed). The GPU tests' one-run compile checks call it too (testing/nvcc_batch.py)."""
  cu, out = workdir / "kernel.cu", workdir / "kernel.cubin"
  cu.write_text(src)
  proc = subprocess.run(["nvcc", *NVCC_FLAGS, f"-arch={arch}", "-o", str(out), str(cu)], capture_output=True, text=True, timeout=600,
                        env=CCompiler._compiler_env())   # no preloaded ASan: nvcc's own programs crash under it
  return proc, out.read_bytes() if proc.returncode == 0 else b""


class CUDACompiler:
  """CUDA source -> cubin for one architecture, with nvcc (or NVRTC), cached in memory and on disk."""
  def __init__(self):
    self._versions: dict[str, str] = {}
    self._lock = threading.Lock()
    self._unwritable: set[Path] = set()   # cache directories already warned about

  def tool(self) -> str:
    if shutil.which("nvcc"): return "nvcc"
    if _nvrtc() is not None: return "nvrtc"
    raise CompileError("neither nvcc (on PATH) nor libnvrtc was found: the CUDA backend needs one of them to compile kernels")

  def version(self, tool: str) -> str:
    if tool not in self._versions:
      if tool == "nvcc": self._versions[tool] = subprocess.run(["nvcc", "--version"], capture_output=True, text=True,
                                                                 env=CCompiler._compiler_env()).stdout.strip().splitlines()[-1]
      else:
        major, minor = ctypes.c_int(), ctypes.c_int()
        _nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        self._versions[tool] = f"nvrtc {major.value}.{minor.value}"
    return self._versions[tool]

  def toolkit(self) -> tuple[int, int, str] | None:
    """(major, minor, the compiler's own words) of the CUDA toolkit that compiles kernels here; None without one."""
    try: tool = self.tool()
    except CompileError: return None
    words = self.version(tool)
    # nvcc: "Build cuda_13.0.r13.0/compiler..." or "Cuda compilation tools, release 13.0, V13.0.88"; NVRTC: "nvrtc 13.5"
    m = re.search(r"release (\d+)\.(\d+)", words) or re.search(r"cuda_(\d+)\.(\d+)", words) or re.search(r"(\d+)\.(\d+)", words)
    return (int(m.group(1)), int(m.group(2)), f"{tool} {m.group(1)}.{m.group(2)}") if m else None

  def compile(self, src: str, name: str, arch: str) -> bytes:
    tool = self.tool()
    key = hashlib.sha256("\0".join([src, arch, " ".join(NVCC_FLAGS), tool, self.version(tool)]).encode()).hexdigest()[:32]
    path = cache_dir() / f"{key}.cubin"
    if (cubin := read_entry(path)) is not None: return cubin
    cubin = self._nvcc(src, arch) if tool == "nvcc" else self._nvrtc(src, name, arch)
    try: write_entry(path, cubin)
    except OSError as e:   # not a directory, read-only, full: the cubin is still good, only not cached
      if path.parent not in self._unwritable:
        self._unwritable.add(path.parent)
        warnings.warn(f"uopc: the CUDA compile cache {path.parent} can't be written ({e.strerror or e}; UOPC_CACHE_DIR chooses it): "
                      "cubins are not cached in this process", RuntimeWarning, stacklevel=2)
    return cubin

  @staticmethod
  def _nvcc(src: str, arch: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="uopc-cuda-") as tmp:
      try: proc, cubin = _run_nvcc(src, arch, Path(tmp))
      except subprocess.TimeoutExpired: raise CompileError("nvcc took more than 10 minutes") from None
      if proc.returncode != 0: raise CompileError(_failure("nvcc", proc.returncode, proc.stderr, src))
      return cubin

  @staticmethod
  def _nvrtc(src: str, name: str, arch: str) -> bytes:
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    _nvrtc_check(lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"{name}.cu".encode(), 0, None, None), "nvrtcCreateProgram")
    try:
      include = _cuda_include()
      if include is None and "#include <cuda_fp16.h>" in src:
        raise CompileError("NVRTC needs cuda_fp16.h for a kernel with f16 values: set CUDA_HOME to a CUDA toolkit, or "
                           "pip install nvidia-cuda-runtime")
      opts = [f"--gpu-architecture={arch}", "--fmad=false", "-std=c++17"] + ([f"--include-path={include}"] if include else [])
      arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
      status = lib.nvrtcCompileProgram(prog, len(opts), arr)
      if status != 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise CompileError(_failure("NVRTC", status, log.value.decode(errors="replace"), src))
      size = ctypes.c_size_t()
      _nvrtc_check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
      cubin = ctypes.create_string_buffer(size.value)
      _nvrtc_check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
      return cubin.raw
    finally: lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _failure(tool: str, status: int, log: str, src: str) -> str:
  numbered = "\n".join(f"{i:4d} | {line}" for i, line in enumerate(src.splitlines(), 1))
  return f"{tool} failed (status {status}):\n{log.strip()}\n--- source ---\n{numbered}"


def _pip_cuda_dirs(sub: str) -> list[Path]:
  """The `sub` folders (lib, include) of NVIDIA's pip wheels: nvidia-cuda-nvrtc and nvidia-cuda-runtime install into
  site-packages/nvidia/cu13/ (CUDA 13) or nvidia/cuda_nvrtc/, nvidia/cuda_runtime/ (CUDA 12)."""
  try: spec = importlib.util.find_spec("nvidia")
  except (ImportError, ValueError): return []
  roots = list(spec.submodule_search_locations or []) if spec is not None else []
  return sorted((p for r in roots for p in Path(r).glob(f"*/{sub}") if p.is_dir()), reverse=True)   # cu13 before cu12


def _cuda_include() -> str | None:
  """A folder holding cuda_fp16.h: $CUDA_HOME's or $CUDA_PATH's include, /usr/local/cuda/include, or a pip wheel's."""
  homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
  for d in [Path(h) / "include" for h in homes if h] + _pip_cuda_dirs("include"):
    if (d / "cuda_fp16.h").is_file(): return str(d)
  return None


@functools.lru_cache(maxsize=None)
def _nvrtc() -> ctypes.CDLL | None:
  """libnvrtc (the system's, else a pip wheel's), or None where it isn't installed (looked for once)."""
  for name in ("libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"):
    try: return ctypes.CDLL(name)
    except OSError: continue
  for folder in _pip_cuda_dirs("lib"):
    # libnvrtc opens libnvrtc-builtins by name when it compiles, and a wheel's libnvrtc without a RUNPATH doesn't look in
    # its own folder for it (every compile failed: "failed to open libnvrtc-builtins.so.13.0"). Loaded first, globally,
    # from the same folder, it is found by its soname
    for builtins in sorted(folder.glob("libnvrtc-builtins.so*"), reverse=True):
      try:
        ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
        break
      except OSError: continue
    for lib in sorted(folder.glob("libnvrtc.so*"), reverse=True):
      try: return ctypes.CDLL(str(lib))
      except OSError: continue
  return None


def _nvrtc_check(status: int, what: str) -> None:
  if status != 0: raise CompileError(f"{what} failed with NVRTC status {status}")


# ---- the driver API --------------------------------------------------------------------------------------------------

# CUresult values the backend tells apart (cuda.h)
CUDA_ERROR_DEINITIALIZED = 4
# a kernel's fault (an illegal address, a trap, a timeout...): the context is lost, and every later call returns it
KERNEL_FAULTS = {700, 702, 710, 714, 715, 716, 717, 718, 719}
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 75, 76
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8


def _load_libcuda() -> ctypes.CDLL | None:
  """libcuda, the driver (installed with it, not with a toolkit), or None where it is missing. Tests put a stand-in here."""
  for name in ("libcuda.so.1", "libcuda.so"):
    try: return ctypes.CDLL(name)
    except OSError: continue
  return None


class _Driver:
  """libcuda through ctypes: the first device's primary context, memory, modules and launches. The driver keeps a
  current context per thread: every entry point makes this one current in the thread that calls it (current())."""
  def __init__(self, lib):
    if lib is None: raise NoDeviceError("no CUDA device was found: the CUDA driver (libcuda.so.1) is not installed on this machine")
    self.lib = lib
    status = lib.cuInit(0)
    if status != 0: raise NoDeviceError(f"no CUDA device was found: cuInit failed ({self.error(status)})")
    version = ctypes.c_int()
    self.check(lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
    self.version = version.value            # the CUDA version the driver supports, 1000 * major + 10 * minor
    count = ctypes.c_int()
    self.check(lib.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    if count.value == 0: raise NoDeviceError("no CUDA device was found: the driver sees no GPU")
    self.device = ctypes.c_int()
    self.check(lib.cuDeviceGet(ctypes.byref(self.device), 0), "cuDeviceGet")
    major, minor = self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
    self.arch = f"sm_{major}{minor}"
    self.max_shared = self.attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)   # a block's, with consent
    self.context = ctypes.c_void_p()
    self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.context), self.device), "cuDevicePrimaryCtxRetain")
    lib.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
    lib.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]
    lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
    lib.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
    lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    self.current()

  def attribute(self, which: int) -> int:
    value = ctypes.c_int()
    self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), which, self.device), f"cuDeviceGetAttribute {which}")
    return value.value

  def current(self) -> None:
    """Make the context current in the calling thread. A thread that never did (one the garbage collector frees a Buffer
    in, a worker's) has none, and every call there would fail with CUDA_ERROR_INVALID_CONTEXT."""
    self.check(self.lib.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

  def error(self, status: int) -> str:
    s = ctypes.c_char_p()
    self.lib.cuGetErrorString(status, ctypes.byref(s))
    return f"CUDA error {status}: {s.value.decode() if s.value else 'unknown'}"

  def wait_for(self, name: str, blocks: int, threads: int) -> None:
    """Wait for the kernel just launched (UOPC_CUDA_SYNC, UOPC_DEBUG), so that a fault names it."""
    if (status := self.lib.cuCtxSynchronize()) != 0:
      raise BackendError(f"kernel {name} ({blocks} blocks of {threads} threads) failed on the device: {self.error(status)}; the CUDA "
                         "context can't be used after a fault: start a new process")

  def check(self, status: int, what: str) -> None:
    if status == 0: return
    # a fault is reported by whatever call comes after the kernel that made it: say so, and how to find the kernel
    hint = ("; a kernel launched before this call faulted, and the context can't be used any more (UOPC_CUDA_SYNC=1 "
            "synchronizes after each launch and names the kernel)") if status in KERNEL_FAULTS else ""
    raise BackendError(f"{what} failed: {self.error(status)}{hint}")


_driver_instance: _Driver | None = None
_driver_error: BackendError | None = None
_driver_lock = threading.Lock()


def _driver() -> _Driver:
  """The driver, initialized once; the reason there is none, every time it is asked for again."""
  global _driver_instance, _driver_error
  if _driver_instance is None:
    with _driver_lock:
      if _driver_instance is None:
        if _driver_error is not None: raise _driver_error
        try: _driver_instance = _Driver(_load_libcuda())
        except BackendError as e:
          _driver_error = e
          raise
  return _driver_instance


def sync_each_launch() -> bool:
  """Whether a launch waits for its kernel and names it when it faults: UOPC_CUDA_SYNC=1, or UOPC_DEBUG=1 and above. A
  kernel's fault otherwise surfaces in the next call that waits (a copy, an alloc), which can't know the kernel."""
  return os.environ.get("UOPC_CUDA_SYNC", "").strip() not in ("", "0") or debug_level() >= 1


@dataclass
class DeviceMemory:
  """n elements of dtype on the GPU (a CUdeviceptr)."""
  ptr: int
  n: int
  dtype: DType

  @property
  def nbytes(self) -> int: return self.n * self.dtype.itemsize


class CUDABackend:
  """NVIDIA GPUs through the driver API (see the module docstring)."""
  name = "CUDA"
  renderer = CUDARenderer()

  def __init__(self):
    self.arch = default_arch()
    asked = os.environ.get("UOPC_CUDA_ARCH", "").strip()
    if asked and asked != self.arch:
      warnings.warn(f"uopc: UOPC_CUDA_ARCH={asked} is not used: kernels are compiled for this machine's GPU, {self.arch} (the "
                    "variable chooses the architecture where there is no GPU)", RuntimeWarning, stacklevel=2)
    self.caps = Caps(gpu=True, max_local=1024, fma=True, tensor_cores=int(self.arch.split("_")[-1].rstrip("a")) >= 80, vector_bytes=16)
    self.compiler = CUDACompiler()
    self._driver_ok = False
    self._fault_warned = False

  def _device(self) -> _Driver:
    """The driver, checked once against the toolkit that compiles the kernels, with its context current in this thread."""
    d = _driver()
    if not self._driver_ok:
      toolkit = self.compiler.toolkit()
      # a cubin of CUDA X.y needs a driver for CUDA X.0 or later (minor version compatibility); older ones refuse it
      if toolkit is not None and d.version < toolkit[0] * 1000:
        raise BackendError(f"the CUDA driver is too old for the CUDA toolkit that compiles uopc's kernels: the driver supports CUDA "
                           f"{d.version // 1000}.{d.version % 1000 // 10} (cuDriverGetVersion {d.version}), the kernels are built by "
                           f"{toolkit[2]}, which needs a driver for CUDA {toolkit[0]}.0 or later: update the NVIDIA driver, or put "
                           f"a CUDA {d.version // 1000} toolkit's nvcc first on PATH")
      self._driver_ok = True
    d.current()
    return d

  def compile(self, src: str, name: str) -> CUDAProgram:
    return CUDAProgram(sanitize_name(name), src, self.arch, self.compiler.compile(src, sanitize_name(name), self.arch), dynamic_shared_bytes(src))

  def alloc(self, n: int, dtype: DType) -> DeviceMemory:
    d = self._device()
    ptr = ctypes.c_uint64()
    d.check(d.lib.cuMemAlloc_v2(ctypes.byref(ptr), max(1, n * dtype.itemsize)), f"cuMemAlloc of {n} {dtype.name}")
    return DeviceMemory(ptr.value, n, dtype)

  def free(self, handle: DeviceMemory) -> None:
    # called from Buffer.__del__, a finalizer, in whichever thread the garbage collector runs: an exception would reach
    # no caller, so a failure is a warning; the context is made current first (that thread may never have had it)
    d = _driver_instance
    if d is None: return
    status = d.lib.cuCtxSetCurrent(d.context)
    if status == 0: status = d.lib.cuMemFree_v2(handle.ptr)
    if status == CUDA_ERROR_DEINITIALIZED: return   # the process is exiting: the driver has let go of all of its memory
    if status in KERNEL_FAULTS:                      # the context is lost: every free fails now, and one warning says so
      if not self._fault_warned:
        self._fault_warned = True
        warnings.warn(f"uopc: cuMemFree failed ({d.error(status)}): after a kernel's fault no device memory is freed until the "
                      "process ends", RuntimeWarning, stacklevel=2)
    elif status != 0:
      warnings.warn(f"uopc: cuMemFree of {handle.nbytes} bytes at {handle.ptr:#x} failed ({d.error(status)}): that memory stays "
                    "allocated until the process ends", RuntimeWarning, stacklevel=2)

  def copyin(self, handle: DeviceMemory, array: np.ndarray) -> None:
    d = self._device()
    array = np.ascontiguousarray(array)
    d.check(d.lib.cuMemcpyHtoD_v2(handle.ptr, array.ctypes.data, array.nbytes), "cuMemcpyHtoD")

  def copyout(self, handle: DeviceMemory) -> np.ndarray:
    d = self._device()
    out = np.empty(handle.n, np.dtype(handle.dtype.fmt))
    d.check(d.lib.cuMemcpyDtoH_v2(out.ctypes.data, handle.ptr, out.nbytes), "cuMemcpyDtoH")
    return out

  def _load(self, d: _Driver, program: CUDAProgram) -> None:
    """The program's module loaded and its function found, allowed the shared memory its launches pass."""
    if program.arch != d.arch: raise BackendError(f"{program.name} was compiled for {program.arch}, the device is {d.arch}")
    if program.shared_bytes > d.max_shared:
      raise BackendError(f"{program.name} needs {program.shared_bytes} bytes of shared memory per block, the device ({d.arch}) "
                         f"gives a block at most {d.max_shared}")
    module, function = ctypes.c_void_p(), ctypes.c_void_p()
    d.check(d.lib.cuModuleLoadData(ctypes.byref(module), program.cubin), f"cuModuleLoadData of {program.name}")
    d.check(d.lib.cuModuleGetFunction(ctypes.byref(function), module, program.name.encode()), f"cuModuleGetFunction {program.name}")
    if program.shared_bytes > MAX_STATIC_SHARED:   # past 48 KiB a kernel gets dynamic shared memory only when allowed it
      d.check(d.lib.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, program.shared_bytes),
              f"cuFuncSetAttribute of {program.name} (MAX_DYNAMIC_SHARED_SIZE_BYTES = {program.shared_bytes})")
    program.function = function

  def _grid(self, program: CUDAProgram, global_size, local_size) -> tuple[int, int]:
    """(blocks, threads) of a launch, checked against the device's limits."""
    blocks, threads = math.prod(global_size or (1,)), math.prod(local_size or (1,))
    if blocks >= 2**31 or threads > self.caps.max_local:
      raise BackendError(f"{program.name}: a grid of {blocks} blocks of {threads} threads is beyond the device (2**31 - 1, {self.caps.max_local})")
    return blocks, threads

  def launch(self, program: CUDAProgram, handles: list[DeviceMemory], global_size=None, local_size=None) -> None:
    d = self._device()
    if program.function is None: self._load(d, program)
    blocks, threads = self._grid(program, global_size, local_size)
    args = [ctypes.c_uint64(h.ptr) for h in handles]
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.byref(a), ctypes.c_void_p) for a in args])
    d.check(d.lib.cuLaunchKernel(program.function, blocks, 1, 1, threads, 1, 1, program.shared_bytes, None, params, None),
            f"cuLaunchKernel {program.name}")
    if sync_each_launch(): d.wait_for(program.name, blocks, threads)

  def graph(self, launches: list[tuple], slots: int) -> CUDAGraph:
    """Launches that always run together, in order (a JIT replay): `launches` are (program, slots of its arguments,
    global size, local size), as launch takes them (see CUDAGraph)."""
    d = self._device()
    items = []
    for prog, args, global_size, local_size in launches:
      if any(not 0 <= a < slots for a in args): raise BackendError(f"graph: {prog.name} reads slot {max(args)} of {slots}")
      if prog.function is None: self._load(d, prog)
      items.append((prog, list(args), *self._grid(prog, global_size, local_size)))
    return CUDAGraph(self, items, slots)

  def synchronize(self) -> None:
    if _driver_instance is None: return   # nothing was ever launched
    d = self._device()
    d.check(d.lib.cuCtxSynchronize(), "cuCtxSynchronize")


class _KernelNodeParams(ctypes.Structure):
  """CUDA_KERNEL_NODE_PARAMS_v2: its first ten fields are v1's (a v1 entry point reads those alone); kern and ctx stay
  NULL (the function's own module and the current context)."""
  _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
              ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
              ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p), ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


_GRAPH_API = {"create": ("cuGraphCreate",), "add": ("cuGraphAddKernelNode_v2", "cuGraphAddKernelNode"),
              "instantiate": ("cuGraphInstantiateWithFlags",), "set": ("cuGraphExecKernelNodeSetParams_v2", "cuGraphExecKernelNodeSetParams"),
              "launch": ("cuGraphLaunch",), "destroy": ("cuGraphDestroy",), "destroy_exec": ("cuGraphExecDestroy",)}
_graph_warned = False


def _graph_api(lib) -> dict | None:
  """The driver's CUDA graph entry points, their argument types set, or None where one is missing."""
  api = {}
  for key, names in _GRAPH_API.items():
    for name in names:
      try:
        api[key] = getattr(lib, name)
        break
      except AttributeError: continue
    else: return None
  P = ctypes.c_void_p
  for key, types in {"create": [P, ctypes.c_uint], "add": [P, P, P, ctypes.c_size_t, P], "instantiate": [P, P, ctypes.c_ulonglong],
                     "set": [P, P, P], "launch": [P, P], "destroy": [P], "destroy_exec": [P]}.items():
    api[key].argtypes = types
  return api


class CUDAGraph:
  """Launches that run together (a JIT replay), as one CUDA graph: kernel nodes in a chain, instantiated once, launched
  with one cuGraphLaunch. Their arguments are packed once, each slot one 64-bit cell that every launch reading it
  points at; the driver copies a node's argument values when the node is made, so a slot given a new buffer (`set`: a
  replay's new arguments and outputs) marks the nodes that read it, and the next run hands those to the graph again
  (cuGraphExecKernelNodeSetParams) before it launches. Where the driver has no graphs, or making one fails, the
  launches go one cuLaunchKernel each from the same packed arguments (a warning says why, once); so they do under
  UOPC_CUDA_SYNC / UOPC_DEBUG, which wait after each kernel and name the one that faulted. A launch through
  CUDABackend.launch packs its arguments and reads its grid again each time: a jitted GPT step of 108 kernels spent
  2.8 ms of its 4.3 in Python, the device busy for 1.5 (an H200's host); packed, 2.2 ms; as one graph, 2.0 (nanoGPT's
  step of about 400 kernels: 14.1 -> 13.5 ms)."""
  def __init__(self, backend: CUDABackend, items: list[tuple[CUDAProgram, list[int], int, int]], slots: int):
    self.backend = backend
    self.cells = [ctypes.c_uint64(0) for _ in range(slots)]
    address = [ctypes.cast(ctypes.byref(c), ctypes.c_void_p) for c in self.cells]
    self.programs = [prog for prog, *_ in items]     # their modules stay loaded while the graph launches them
    self.launches = [(prog.function, blocks, threads, prog.shared_bytes, (ctypes.c_void_p * max(1, len(args)))(*[address[a] for a in args]))
                     for prog, args, blocks, threads in items]
    self.readers: list[list[int]] = [[] for _ in range(slots)]     # slot -> the launches that read it
    for k, (_, args, *_) in enumerate(items):
      for a in sorted(set(args)): self.readers[a].append(k)
    self.native: tuple | None = None     # (api, exec, nodes, node params) once built
    self.tried = False
    self.stale: set[int] = set()         # launches whose argument values the native graph has not been given

  def __call__(self, handles: list[DeviceMemory]) -> None:
    """Run with every slot's handle."""
    for i, h in enumerate(handles): self.set(i, h)
    self.run()

  def set(self, i: int, handle: DeviceMemory) -> None:
    """Slot i's handle for the runs from now on."""
    if self.cells[i].value != handle.ptr:
      self.cells[i].value = handle.ptr
      self.stale.update(self.readers[i])

  def run(self) -> None:
    d = self.backend._device()
    if sync_each_launch(): return self._launch_each(d, sync=True)
    if not self.tried: self._build(d)
    if self.native is None: return self._launch_each(d, sync=False)
    api, graph_exec, nodes, params, _ = self.native
    for k in self.stale: d.check(api["set"](graph_exec, nodes[k], ctypes.byref(params[k])), f"cuGraphExecKernelNodeSetParams {self.programs[k].name}")
    self.stale.clear()
    d.check(api["launch"](graph_exec, None), "cuGraphLaunch")

  def _launch_each(self, d: _Driver, sync: bool) -> None:
    launch = d.lib.cuLaunchKernel
    for k, (function, blocks, threads, shared, params) in enumerate(self.launches):
      if (status := launch(function, blocks, 1, 1, threads, 1, 1, shared, None, params, None)) != 0:
        d.check(status, f"cuLaunchKernel {self.programs[k].name}")
      if sync: d.wait_for(self.programs[k].name, blocks, threads)

  def _build(self, d: _Driver) -> None:
    """The launches as one instantiated CUDA graph, with the cells' values now; on any failure, none (and a warning)."""
    global _graph_warned
    self.tried = True
    api = _graph_api(d.lib)
    graph = ctypes.c_void_p()
    try:
      if api is None: raise BackendError("the driver has no CUDA graph API (cuGraphCreate, cuGraphAddKernelNode, ...)")
      d.check(api["create"](ctypes.byref(graph), 0), "cuGraphCreate")
      nodes, params, prev = [], [], None
      for k, (function, blocks, threads, shared, args) in enumerate(self.launches):
        p = _KernelNodeParams(function, blocks, 1, 1, threads, 1, 1, shared, ctypes.cast(args, ctypes.c_void_p), None, None, None)
        node, deps = ctypes.c_void_p(), (ctypes.c_void_p * 1)(prev) if prev is not None else None
        d.check(api["add"](ctypes.byref(node), graph, deps, 0 if deps is None else 1, ctypes.byref(p)),
                f"cuGraphAddKernelNode {self.programs[k].name}")
        nodes.append(node)
        params.append(p)
        prev = node.value
      graph_exec = ctypes.c_void_p()
      d.check(api["instantiate"](ctypes.byref(graph_exec), graph, 0), "cuGraphInstantiateWithFlags")
      self.native = (api, graph_exec, nodes, params, graph)     # the nodes are the graph's: it lives as long
      self.stale.clear()
    except (BackendError, ctypes.ArgumentError) as e:   # a driver that refuses, or an entry point of another signature
      if not _graph_warned:
        _graph_warned = True
        warnings.warn(f"uopc: a JIT replay's CUDA graph could not be made ({e}); its kernels are launched one by one", RuntimeWarning, stacklevel=3)
    if self.native is None and graph.value and api is not None: api["destroy"](graph)

  def __del__(self):
    if self.native is not None and _driver_instance is not None:
      api, graph_exec, _, _, graph = self.native
      self.native = None
      api["destroy_exec"](graph_exec)
      api["destroy"](graph)


def device_available() -> bool:
  """Whether a CUDA device can be used here (the driver loads and sees a GPU)."""
  try:
    _driver()
    return True
  except BackendError: return False


__all__ = ["CUDABackend", "CUDAGraph", "CUDARenderer", "CUDACompiler", "CUDAProgram", "NoDeviceError", "device_available", "default_arch",
           "dynamic_shared_bytes", "sync_each_launch", "HELPERS", "NVCC_FLAGS", "MAX_STATIC_SHARED"]
