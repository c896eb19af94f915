"""uopc-example-backend: a uopc backend written outside the project, the way a third party adds one.

    pip install ./examples/uopc-example-backend        # declares INTERP under the entry point group "uopc.backends"
    UOPC_DEVICE=INTERP python train.py                 # every Tensor without a device= runs here
    Tensor(x, device="INTERP")                         # or one tensor at a time

INTERP runs uopc's linearized programs with uopc.interpret, the reference interpreter of uopc-lower: one statement at a
time, with the evaluator's scalar semantics (the C backend's: f32 rounds per operation, i32 wraps, MAX propagates NaN,
x // 0 == 0). It is slow and exact, and it needs no compiler. It is written only against the backend contract in the
docstring of uopc.backends, which is all a backend may assume:

  * renderer = None: there is no source text, so uopc.runtime hands `compile` the LinearProgram itself (already proven
    memory-safe: making a LinearProgram runs the proof), and `launch` gets back what `compile` returned;
  * caps = Caps(): one thread and no vector lanes, so uopc.opt chooses the plain loops (Opts()) for every kernel;
  * memory is host memory, NumPy arrays of the buffer's dtype; a launch reads every parameter into a list of Python
    values (the interpreter's memory), runs the program, and writes back the buffers the program stores into.

Nothing here registers itself: uopc.backends.get_backend("INTERP") finds the class through the entry point this
distribution's pyproject.toml declares, and makes one instance per process.
"""
from __future__ import annotations
import threading
import numpy as np
from uopc.uop import Ops
from uopc.dtype import DType
from uopc.opt import Caps
from uopc.interpret import InterpretError, run_linear
from uopc.backends import BackendError, LinearProgram, base_memory

__version__ = "0.1.0"


class InterpretedProgram:
  """What compile() returns: the program, and the slots of the buffers it stores into (the only ones copied back)."""
  def __init__(self, program: LinearProgram):
    self.name, self.uops, self.params = program.name, list(program.uops), program.params
    stores = [u.src[0] for u in self.uops if u.op is Ops.STORE]
    self.written = {m.arg.slot for i in stores if (m := base_memory(i.src[0])).op is Ops.BUFFER}


class InterpreterBackend:
  """The backend INTERP: uopc.interpret.run_linear over NumPy arrays (see the module docstring)."""
  name = "INTERP"
  renderer = None
  caps = Caps()

  def __init__(self):
    self.launches = 0          # how many programs ran here: the example's tests check that their Tensors came this way
    self._lock = threading.Lock()

  def compile(self, program: LinearProgram, name: str) -> InterpretedProgram:
    if not isinstance(program, LinearProgram):
      raise BackendError(f"INTERP has no renderer: compile takes the LinearProgram itself, got {type(program).__name__} for {name!r}")
    return InterpretedProgram(program)

  def alloc(self, n: int, dtype: DType) -> np.ndarray:
    if dtype.fmt is None: raise BackendError(f"INTERP can't allocate {dtype} memory")
    return np.zeros(n, np.dtype(dtype.fmt))

  def copyin(self, handle: np.ndarray, array: np.ndarray) -> None: handle[...] = array
  def copyout(self, handle: np.ndarray) -> np.ndarray: return handle.copy()

  def launch(self, program: InterpretedProgram, handles: list[np.ndarray], global_size=None, local_size=None) -> None:
    if global_size or local_size: raise BackendError(f"{program.name}: INTERP has no launch grid (got {global_size}, {local_size})")
    # one list per distinct array, so that two parameters given one array would see each other's stores, as in memory
    values: dict[int, list] = {}
    memory = {p.arg.slot: values.setdefault(id(h), h.tolist()) for p, h in zip(program.params, handles)}
    try: run_linear(program.uops, memory)
    except InterpretError as e: raise BackendError(f"{program.name} on INTERP: {e}") from None
    for p, h in zip(program.params, handles):
      if p.arg.slot in program.written: h[...] = memory[p.arg.slot]
    with self._lock: self.launches += 1

  def synchronize(self) -> None: pass   # a launch returns when the program has run


__all__ = ["InterpreterBackend", "InterpretedProgram"]
