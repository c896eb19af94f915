"""A stand-in for libcuda, the CUDA driver, for testing the CUDA backend's driver calls where there is no GPU.

    fake = FakeLibcuda(arch="sm_90")
    monkeypatch.setattr(uopc.backends.cuda, "_load_libcuda", lambda: fake)     # what the backend loads instead of libcuda

It has the functions the backend calls through ctypes, taking the same arguments (ctypes objects, byref pointers,
plain ints) and returning the CUresult a driver returns in the same state. It keeps what a driver keeps: one device
(its compute capability, the CUDA version it supports, its shared-memory limit), the primary context and, per thread,
which context is current (a thread starts with none, and then every call that needs one returns
CUDA_ERROR_INVALID_CONTEXT), device memory (a bytearray per allocation, so copies really copy), loaded modules and
their functions with their attributes. `calls` records every call (name, arguments as plain values, thread name).

What it checks as the driver does: a module image must be a cubin for an architecture the device runs (same major
version, minor not above the device's: else CUDA_ERROR_NO_BINARY_FOR_GPU); a function is looked up by name in the
image; a launch of more than 1024 threads per block, or with more than 48 KiB of dynamic shared memory without
MAX_DYNAMIC_SHARED_SIZE_BYTES allowing it, is CUDA_ERROR_INVALID_VALUE; freeing an address that is not allocated is
CUDA_ERROR_INVALID_VALUE. A launch of the function named in `fault_in` returns success (launches are asynchronous) and
leaves the context with CUDA_ERROR_ILLEGAL_ADDRESS, which every later call returns (a fault is sticky). Kernels do not
run: their output memory keeps what it held. CUDA graphs: kernel nodes copy their arguments' values when they are made
or set (cuGraphExecKernelNodeSetParams), an instantiated graph keeps its own copies, and cuGraphLaunch runs its nodes as
launches (`graph=True` in `launches`); a node's arguments are read only for functions whose parameter count `arity`
gives (a cubin holds it); `no_graphs` makes a driver without the graph API.
"""
from __future__ import annotations
import ctypes, struct, threading

SUCCESS, INVALID_VALUE, OUT_OF_MEMORY, NOT_INITIALIZED = 0, 1, 2, 3
INVALID_CONTEXT, NO_BINARY_FOR_GPU, NOT_FOUND, ILLEGAL_ADDRESS = 201, 209, 500, 700
ERROR_STRINGS = {SUCCESS: "no error", INVALID_VALUE: "invalid argument", OUT_OF_MEMORY: "out of memory",
                 NOT_INITIALIZED: "initialization error", INVALID_CONTEXT: "invalid device context",
                 NO_BINARY_FOR_GPU: "no kernel image is available for execution on the device", NOT_FOUND: "named symbol not found",
                 ILLEGAL_ADDRESS: "an illegal memory access was encountered"}
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8                     # CUfunction_attribute
STATIC_SHARED_LIMIT = 48 * 1024


def cubin_for(arch: str, *names: str) -> bytes:
  """A stand-in cubin: an ELF header whose flags name `arch` as nvcc 13 writes them (bits 8-15: the SM number), then
  the function names (the string table a real one has)."""
  sm = int(arch.split("_")[1].rstrip("a"))
  header = b"\x7fELF" + bytes([2, 1, 1, 0x41, 8]) + bytes(7) + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, 0, (sm << 8) | 0x6000004,
                                                                             64, 0, 0, 64, 0, 0)
  return header + b"\0".join(n.encode() for n in names) + b"\0"


def cubin_arch(image: bytes) -> int | None:
  """The SM number a cubin is for (nvcc 13's ELF flags: bits 8-15; before ABI version 8, bits 0-7), None for no ELF."""
  if image[:4] != b"\x7fELF" or len(image) < 52: return None
  flags = struct.unpack_from("<I", image, 48)[0]
  return (flags >> 8) & 0xFF if image[8] >= 8 else flags & 0xFF


def _value(x):
  """A ctypes argument as a plain value (an int, bytes, or None)."""
  return x.value if isinstance(x, (ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint, ctypes.c_size_t)) else x


def _pointer_args(params) -> list[int]:
  """The 64-bit values a launch's kernelParams point at (uopc's kernels take device pointers alone)."""
  return [ctypes.c_uint64.from_address(a).value for a in params] if params is not None else []


def _out(ref, value) -> None:
  """Write through a byref() pointer, as the driver writes its out-parameters."""
  ref._obj.value = value


class _Function:
  """A driver function: callable, and takes the argtypes/restype attributes the backend sets on a ctypes function."""
  def __init__(self, fake: FakeLibcuda, name: str, impl):
    self.fake, self.name, self.impl = fake, name, impl

  def __call__(self, *args):
    plain = tuple("<out>" if type(a).__name__ == "CArgObject" else _value(a) for a in args)
    self.fake.calls.append((self.name, plain, threading.current_thread().name))
    return self.impl(*args)


class FakeLibcuda:
  """See the module docstring. `arch` is the device's compute capability, `driver_version` what cuDriverGetVersion says."""
  def __init__(self, arch: str = "sm_90", driver_version: int = 13000, max_shared: int = 227 * 1024, memory: int = 1 << 34):
    self.arch, self.driver_version, self.max_shared, self.memory = arch, driver_version, max_shared, memory
    self.calls: list[tuple[str, tuple, str]] = []
    self.context = 0xC0DE0000
    self.initialized = False
    self.sticky = SUCCESS                                  # a kernel's fault: every later call returns it
    self.fault_in: str | None = None                       # the function whose launches fault
    self.allocations: dict[int, bytearray] = {}
    self.modules: dict[int, bytes] = {}
    self.functions: dict[int, tuple[str, dict[int, int]]] = {}   # handle -> (name, attributes)
    self.launches: list[dict] = []
    self.graphs: dict[int, list[int]] = {}                 # graph -> its kernel nodes, in order
    self.nodes: dict[int, dict] = {}                       # node -> the launch it makes (arguments copied when made)
    self.execs: dict[int, dict[int, dict]] = {}            # instantiated graph -> node -> its launch
    self.arity: dict[str, int] = {}                        # function name -> its number of parameters (a cubin says)
    self.no_graphs = False                                 # a driver without the CUDA graph API
    self._current = threading.local()
    self._next = 0x7F0000000000
    self._error_strings = {k: ctypes.c_char_p(v.encode()) for k, v in ERROR_STRINGS.items()}

  def __getattr__(self, name: str):
    if name.startswith("cuGraph") and self.__dict__.get("no_graphs"): raise AttributeError(f"the fake libcuda has no {name}")
    impl = getattr(type(self), f"_{name}", None)
    if impl is None: raise AttributeError(f"the fake libcuda has no {name}")
    fn = _Function(self, name, impl.__get__(self))
    setattr(self, name, fn)   # one object per name, so the attributes the backend sets on it stay
    return fn

  # -- state the tests read
  def live_bytes(self) -> int: return sum(map(len, self.allocations.values()))
  def called(self, name: str) -> list[tuple]: return [args for n, args, _ in self.calls if n == name]

  # -- helpers
  def _handle(self) -> int:
    self._next += 0x1000
    return self._next

  def _needs_context(self) -> int:
    if not self.initialized: return NOT_INITIALIZED
    if self.sticky: return self.sticky
    return SUCCESS if getattr(self._current, "context", None) == self.context else INVALID_CONTEXT

  def _find(self, ptr: int, n: int) -> tuple[bytearray, int] | None:
    for base, mem in self.allocations.items():
      if base <= ptr and ptr + n <= base + len(mem): return mem, ptr - base
    return None

  # -- the driver API (each returns a CUresult)
  def _cuInit(self, flags):
    self.initialized = True
    return SUCCESS

  def _cuDriverGetVersion(self, version):
    _out(version, self.driver_version)
    return SUCCESS

  def _cuGetErrorString(self, status, out):
    _out(out, self._error_strings.get(status, ctypes.c_char_p(b"unknown error")).value)
    return SUCCESS if status in ERROR_STRINGS else INVALID_VALUE

  def _cuDeviceGetCount(self, count):
    if not self.initialized: return NOT_INITIALIZED
    _out(count, 1)
    return SUCCESS

  def _cuDeviceGet(self, device, ordinal):
    if _value(ordinal) != 0: return INVALID_VALUE
    _out(device, 0)
    return SUCCESS

  def _cuDeviceGetAttribute(self, value, attribute, device):
    sm = self.arch.split("_")[1].rstrip("a")
    values = {75: int(sm[:-1]), 76: int(sm[-1]), 97: self.max_shared}
    if _value(attribute) not in values: return INVALID_VALUE
    _out(value, values[_value(attribute)])
    return SUCCESS

  def _cuDevicePrimaryCtxRetain(self, context, device):
    if not self.initialized: return NOT_INITIALIZED
    _out(context, self.context)
    return SUCCESS

  def _cuCtxSetCurrent(self, context):
    self._current.context = _value(context)
    return SUCCESS

  def _cuMemAlloc_v2(self, ptr, size):
    if status := self._needs_context(): return status
    if self.live_bytes() + _value(size) > self.memory: return OUT_OF_MEMORY
    handle = self._handle()
    self.allocations[handle] = bytearray(_value(size))
    _out(ptr, handle)
    return SUCCESS

  def _cuMemFree_v2(self, ptr):
    if status := self._needs_context(): return status
    return SUCCESS if self.allocations.pop(_value(ptr), None) is not None else INVALID_VALUE

  def _cuMemcpyHtoD_v2(self, dst, src, n):
    if status := self._needs_context(): return status
    if (found := self._find(_value(dst), _value(n))) is None: return INVALID_VALUE
    mem, at = found
    mem[at:at + _value(n)] = ctypes.string_at(_value(src), _value(n))
    return SUCCESS

  def _cuMemcpyDtoH_v2(self, dst, src, n):
    if status := self._needs_context(): return status
    if (found := self._find(_value(src), _value(n))) is None: return INVALID_VALUE
    mem, at = found
    ctypes.memmove(_value(dst), bytes(mem[at:at + _value(n)]), _value(n))
    return SUCCESS

  def _cuModuleLoadData(self, module, image):
    if status := self._needs_context(): return status
    data = bytes(image)
    sm, dev = cubin_arch(data), int(self.arch.split("_")[1].rstrip("a"))
    if sm is None or sm // 10 != dev // 10 or sm % 10 > dev % 10: return NO_BINARY_FOR_GPU
    handle = self._handle()
    self.modules[handle] = data
    _out(module, handle)
    return SUCCESS

  def _cuModuleGetFunction(self, function, module, name):
    if status := self._needs_context(): return status
    image = self.modules.get(_value(module))
    if image is None: return INVALID_VALUE
    if name + b"\0" not in image: return NOT_FOUND
    handle = self._handle()
    self.functions[handle] = (name.decode(), {})
    _out(function, handle)
    return SUCCESS

  def _cuFuncSetAttribute(self, function, attribute, value):
    if status := self._needs_context(): return status
    if (f := self.functions.get(_value(function))) is None: return INVALID_VALUE
    if _value(attribute) == MAX_DYNAMIC_SHARED_SIZE_BYTES and _value(value) > self.max_shared: return INVALID_VALUE
    f[1][_value(attribute)] = _value(value)
    return SUCCESS

  def _kernel(self, function, blocks: int, threads: int, shared: int, args: list[int] | None) -> dict | int:
    """A launch's record, or the CUresult a driver refuses it with."""
    if (f := self.functions.get(_value(function))) is None: return INVALID_VALUE
    name, attributes = f
    if threads > 1024: return INVALID_VALUE
    if shared > max(STATIC_SHARED_LIMIT, attributes.get(MAX_DYNAMIC_SHARED_SIZE_BYTES, 0)): return INVALID_VALUE
    return {"name": name, "blocks": blocks, "threads": threads, "shared": shared, "args": args}

  def _run(self, record: dict, graph: bool) -> None:
    self.launches.append({**record, "thread": threading.current_thread().name, "graph": graph})
    if record["name"] == self.fault_in: self.sticky = ILLEGAL_ADDRESS     # reported by a later call, as a real fault is

  def _cuLaunchKernel(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    if status := self._needs_context(): return status
    record = self._kernel(function, _value(gx) * _value(gy) * _value(gz), _value(bx) * _value(by) * _value(bz), _value(shared), _pointer_args(params))
    if isinstance(record, int): return record
    self._run(record, graph=False)
    return SUCCESS

  # -- CUDA graphs: a node copies its arguments' values when it is made or set, as the driver does (kernelParams is an
  # array of pointers to them, read then: the node's arity is the function's, which a cubin holds and `arity` stands for)
  def _node(self, params) -> dict | int:
    p = params._obj
    name = self.functions.get(p.func, ("?",))[0]
    n = self.arity.get(name)
    args = None if n is None else [ctypes.c_uint64.from_address(a).value for a in (ctypes.c_void_p * n).from_address(p.kernelParams)]
    return self._kernel(p.func, p.gridDimX * p.gridDimY * p.gridDimZ, p.blockDimX * p.blockDimY * p.blockDimZ, p.sharedMemBytes, args)

  def _cuGraphCreate(self, graph, flags):
    if status := self._needs_context(): return status
    handle = self._handle()
    self.graphs[handle] = []
    _out(graph, handle)
    return SUCCESS

  def _cuGraphAddKernelNode_v2(self, node, graph, deps, ndeps, params):
    if status := self._needs_context(): return status
    if (nodes := self.graphs.get(_value(graph))) is None: return INVALID_VALUE
    record = self._node(params)
    if isinstance(record, int): return record
    handle = self._handle()
    self.nodes[handle] = record
    nodes.append(handle)
    _out(node, handle)
    return SUCCESS

  def _cuGraphInstantiateWithFlags(self, graph_exec, graph, flags):
    if status := self._needs_context(): return status
    if (nodes := self.graphs.get(_value(graph))) is None: return INVALID_VALUE
    handle = self._handle()
    self.execs[handle] = {n: dict(self.nodes[n]) for n in nodes}     # its own copies: a graph's later changes don't reach it
    _out(graph_exec, handle)
    return SUCCESS

  def _cuGraphExecKernelNodeSetParams_v2(self, graph_exec, node, params):
    if status := self._needs_context(): return status
    if (nodes := self.execs.get(_value(graph_exec))) is None or _value(node) not in nodes: return INVALID_VALUE
    # the node is named by its handle in the graph the exec was made from, so that graph must still be alive
    if not any(_value(node) in graph for graph in self.graphs.values()): return INVALID_VALUE
    record = self._node(params)
    if isinstance(record, int): return record
    nodes[_value(node)] = record
    return SUCCESS

  def _cuGraphLaunch(self, graph_exec, stream):
    if status := self._needs_context(): return status
    if (nodes := self.execs.get(_value(graph_exec))) is None: return INVALID_VALUE
    for record in nodes.values(): self._run(record, graph=True)
    return SUCCESS

  def _cuGraphDestroy(self, graph):
    return SUCCESS if self.graphs.pop(_value(graph), None) is not None else INVALID_VALUE

  def _cuGraphExecDestroy(self, graph_exec):
    return SUCCESS if self.execs.pop(_value(graph_exec), None) is not None else INVALID_VALUE

  def _cuCtxSynchronize(self):
    return self._needs_context()
