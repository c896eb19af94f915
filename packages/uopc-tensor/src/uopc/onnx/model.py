"""uopc.onnx.model: `load` an ONNX model, and the model object that runs it.

    model = uopc.onnx.load("resnet.onnx")
    (logits,) = model(image)                  # NumPy arrays or Tensors, by position or by input name
    (logits,) = model(input=image)
    model.run_tensors(image)                   # the outputs as lazy Tensors (uopc's dtypes), to compute on

Loading reads the file with the `onnx` package (external data too), inlines the model's local functions, runs ONNX's
type inference (every value's declared type: uopc.onnx.dtypes) and builds the graph (uopc.onnx.graph): an op or a type
uopc can't compute is a NotImplementedError here, before any input is seen. A call checks each input against the graph's
declaration (rank, fixed sizes, the same size wherever one symbolic dimension appears, a type that converts exactly) and
returns the outputs in the graph's order as NumPy arrays of their declared types.

Serving: a call goes through uopc.jit, one jitted function per input signature (shapes and dtypes, and the values of any
input the graph reads as a shape). The jit's first call runs the graph, its second captures the kernel launches, and
every later call replays them: no graph is built, nothing is kernelized, and no Tensor is made (each NumPy input is
copied into a Tensor the model keeps for that signature; calls are serialized by the model's lock). A graph whose
shapes depend on its data (NonZero, a data-dependent If) can't be captured; it runs plainly on every call
(`model.jitted` says which).
"""
from __future__ import annotations
import os, threading
from collections import OrderedDict
from typing import Any, NamedTuple
import numpy as np
import onnx
from onnx import ModelProto
from uopc.tensor import Tensor, JitError
from uopc.jit import jit
from uopc.onnx.dtypes import OnnxError, np_type, to_tensor, to_numpy, compute_dtype, computed, onnx_type_name
from uopc.tensor.storage import buffer_of
from uopc.onnx.graph import Graph, Env, infer_types
from uopc.onnx.registry import canonical_domain
from uopc.onnx import ops_math, ops_shape, ops_nn, ops_seq, ops_resize  # noqa: F401  (each registers its handlers)

MAX_JITTED = 8   # input signatures a model keeps a jitted function for


class ValueSpec(NamedTuple):
  """An input or output of the graph: its name, declared type (None when uopc can't compute it) and shape (ints, names of
  symbolic dimensions, or None for an unknown one; None for an unknown rank)."""
  name: str
  dtype: np.dtype | None
  type_name: str
  shape: tuple | None


def _spec(vi) -> ValueSpec:
  kind = vi.type.WhichOneof("value")
  if kind != "tensor_type": return ValueSpec(vi.name, None, kind or "unknown", None)
  tt = vi.type.tensor_type
  try: d = np_type(tt.elem_type)
  except NotImplementedError: d = None
  shape = tuple(x.dim_value if x.HasField("dim_value") else (x.dim_param or None) for x in tt.shape.dim) if tt.HasField("shape") else None
  return ValueSpec(vi.name, d, onnx_type_name(tt.elem_type), shape)


def read_model(source) -> ModelProto:
  """A ModelProto from a path, bytes or a ModelProto (copied: loading never changes the caller's)."""
  if isinstance(source, ModelProto):
    m = ModelProto()
    m.CopyFrom(source)
    return m
  if isinstance(source, (bytes, bytearray)): return onnx.load_from_string(bytes(source))
  if isinstance(source, (str, os.PathLike)):
    try: return onnx.load(os.fspath(source))
    except FileNotFoundError: raise
    except Exception as e: raise OnnxError(f"{os.fspath(source)}: not an ONNX model ({type(e).__name__}: {e})") from None
  raise OnnxError(f"load takes a path, bytes or an onnx.ModelProto, got {type(source).__name__}")


def prepare_proto(model: ModelProto) -> ModelProto:
  """The model with its local functions inlined and ONNX's type inference run (types of every intermediate value)."""
  if model.functions:
    import onnx.inliner
    model = onnx.inliner.inline_local_functions(model)
  try: return onnx.shape_inference.infer_shapes(model, strict_mode=False)
  except Exception:   # inference is a help, not a requirement: values without a declared type get the fallback rule
    return model


def opsets_of(model: ModelProto) -> dict[str, int]:
  out = {canonical_domain(o.domain): o.version for o in model.opset_import}
  if "" not in out and not model.opset_import: out[""] = 1
  return out


class OnnxModel:
  """An ONNX model ready to run on a uopc device. Call it with the graph's inputs (NumPy arrays, Tensors or numbers, by
  position or by name); it returns the outputs in the graph's order, as NumPy arrays of the declared types."""

  def __init__(self, proto: ModelProto, device: str | None = None, use_jit: bool = True):
    self.proto = prepare_proto(proto)
    self.opsets = opsets_of(self.proto)
    self.device = Tensor.zeros(1, device=device).device if device is not None else Tensor.zeros(1).device
    self.graph = Graph(self.proto.graph, self.opsets)
    by_name = {vi.name: vi for vi in self.proto.graph.input}
    self.inputs = [_spec(by_name[n]) for n in self.graph.inputs]
    self.outputs = [_spec(vi) for vi in self.proto.graph.output]
    self.use_jit = use_jit
    self.jitted: dict[tuple, Any] = OrderedDict()   # input signature -> its jitted function, or None where it can't be jitted
    self._host_inputs: set[str] | None = None        # the inputs the graph reads as host values (known after the first call)
    self.interpreted = 0                              # calls that built the graph (the rest were jit replays)
    self._staging: dict[tuple, dict[str, Tensor]] = {}   # input signature -> the input Tensors its jitted calls refill
    self._lock = threading.Lock()

  # ---- inputs
  def _bind(self, args: tuple, kwargs: dict) -> list:
    """The call's arguments in the order of self.inputs, each checked against its declaration."""
    names = ", ".join(s.name for s in self.inputs)
    if len(args) > len(self.inputs): raise OnnxError(f"{len(args)} inputs given, the model takes {len(self.inputs)}: {names}")
    values: dict[str, Any] = dict(zip((s.name for s in self.inputs), args))
    for k, v in kwargs.items():
      if k not in {s.name for s in self.inputs}: raise OnnxError(f"the model has no input {k!r} (its inputs: {names})")
      if k in values: raise OnnxError(f"input {k!r} given twice, by position and by name")
      values[k] = v
    dims: dict[str, int] = {}
    out = []
    for spec in self.inputs:
      if spec.name not in values: raise OnnxError(f"input {spec.name!r} is missing (the model takes {names})")
      v = values[spec.name]
      if v is None: out.append(None); continue
      if spec.dtype is None: raise NotImplementedError(f"uopc.onnx: input {spec.name!r} is a {spec.type_name}, which uopc doesn't compute")
      if not isinstance(v, Tensor): v = np.asarray(v)
      shape = tuple(v.shape)
      if spec.shape is not None:
        if len(shape) != len(spec.shape):
          raise OnnxError(f"input {spec.name!r} has shape {shape}, the model declares {len(spec.shape)} dimensions {spec.shape}")
        for d, want in zip(shape, spec.shape):
          if isinstance(want, int) and want > 0 and d != want:
            raise OnnxError(f"input {spec.name!r} has shape {shape}, the model declares {spec.shape}")
          if isinstance(want, str) and dims.setdefault(want, d) != d:
            raise OnnxError(f"input {spec.name!r} has shape {shape}: dimension {want!r} is {dims[want]} elsewhere")
      if isinstance(v, Tensor):
        if v.dtype is not compute_dtype(spec.dtype):
          raise OnnxError(f"input {spec.name!r} is a {v.dtype.name} Tensor, the model declares {spec.dtype} "
                          f"(computed in {compute_dtype(spec.dtype).name})")
        if v.device != self.device: v = v.to(self.device)
      elif v.dtype.kind in "USO": raise NotImplementedError(f"uopc.onnx: input {spec.name!r} holds strings, which uopc doesn't compute")
      out.append(v)
    return out

  # ---- running
  def _run(self, values: list, hosts: dict[str, np.ndarray]) -> tuple[list, Env]:
    """Interpret the graph over Tensor inputs (host copies of those given as NumPy in `hosts`): the outputs as held."""
    self.interpreted += 1
    env = Env(self.device)
    env.hosts = hosts
    outs = self.graph.run(env, values)
    return outs, env

  def _tensors_of(self, values: list) -> tuple[list, dict[str, np.ndarray]]:
    tensors = [to_tensor(v, spec.dtype, self.device, f"input {spec.name!r}") if isinstance(v, np.ndarray) else v
               for spec, v in zip(self.inputs, values)]
    return tensors, self._hosts_of(values)

  def run_tensors(self, *args, **kwargs) -> list[Tensor]:
    """The outputs as lazy Tensors (in the dtypes uopc computes them in), without jit: to compute further on them."""
    tensors, hosts = self._tensors_of(self._bind(args, kwargs))
    outs, env = self._run(tensors, hosts)
    return [o if not isinstance(o, np.ndarray) else to_tensor(o, spec.dtype, self.device, f"output {spec.name!r}")
            for o, spec in zip(outs, self.outputs)]

  def __call__(self, *args, **kwargs) -> list[np.ndarray]:
    values = self._bind(args, kwargs)
    if not self.use_jit or self._host_inputs is None:   # the first call: plain, learning which inputs are read as shapes
      tensors, hosts = self._tensors_of(values)
      outs, env = self._run(tensors, hosts)
      self._host_inputs = {n for n in env.host_reads if n in hosts}
      return self._numpy(outs)
    hosts = self._hosts_of(values)
    key = (tuple(None if v is None else (v.shape, v.dtype if isinstance(v, Tensor) else compute_dtype(spec.dtype))
                 for spec, v in zip(self.inputs, values)),
           tuple((n, hosts[n].tobytes()) for n in sorted(self._host_inputs) if n in hosts))
    fn = self._jitted_for(key)
    if fn is not None:
      with self._lock:
        tensors = self._staged(key, values)
        try: return self._numpy(fn([t for t in tensors if t is not None], {n: hosts[n] for n in self._host_inputs if n in hosts}))
        except JitError:
          # data-dependent shapes (NonZero, ...) read values while the jit captures: this signature runs plainly from now on
          self.jitted[key] = None
    tensors, _ = self._tensors_of(values)
    outs, _ = self._run(tensors, hosts)
    return self._numpy(outs)

  def _hosts_of(self, values: list) -> dict[str, np.ndarray]:
    return {spec.name: v.astype(spec.dtype) if v.dtype != spec.dtype else v
            for spec, v in zip(self.inputs, values) if isinstance(v, np.ndarray)}

  def _staged(self, key: tuple, values: list) -> list:
    """The call's inputs as Tensors for the jitted function of `key`: each NumPy input copied into a Tensor the model
    keeps for that signature, made on its first call. Nobody else sees those Tensors (the outputs go back as NumPy
    copies), so refilling them is safe, and a call makes no Tensor (two graph nodes, a Buffer and their checks cost more
    than the MLP's kernels). Called under the model's lock: two threads must not refill them at once."""
    staged = self._staging.setdefault(key, {})
    out = []
    for spec, v in zip(self.inputs, values):
      if not isinstance(v, np.ndarray): out.append(v); continue
      arr, _ = computed(v, spec.dtype, f"input {spec.name!r}")
      t = staged.get(spec.name)
      if t is not None and (b := buffer_of(t.uop)) is not None: b.copyin(arr)
      else: t = staged[spec.name] = Tensor(arr, device=self.device)
      out.append(t)
    return out

  def _jitted_for(self, key: tuple):
    if key in self.jitted:
      self.jitted.move_to_end(key)
      return self.jitted[key]
    present = [k for k, s in enumerate(self.inputs)]
    def run(tensors: list[Tensor], hosts: dict[str, np.ndarray]) -> list[Tensor]:
      it = iter(tensors)
      values = [next(it) if key[0][k] is not None else None for k in present]
      outs, _ = self._run(values, dict(hosts))
      return [o if not isinstance(o, np.ndarray) else to_tensor(o, spec.dtype, self.device, f"output {spec.name!r}")
              for o, spec in zip(outs, self.outputs)]
    self.jitted[key] = fn = jit(run)
    while len(self.jitted) > MAX_JITTED: self._staging.pop(self.jitted.popitem(last=False)[0], None)
    return fn

  def _numpy(self, outs: list) -> list[np.ndarray]:
    result = []
    for o, spec in zip(outs, self.outputs):
      if o is None: raise OnnxError(f"output {spec.name!r} has no value (an optional output the graph leaves empty)")
      if isinstance(o, np.ndarray): result.append(o.astype(spec.dtype) if spec.dtype is not None and o.dtype != spec.dtype else o)
      else:
        if spec.dtype is not None and o.dtype is not compute_dtype(spec.dtype): o = o.cast(compute_dtype(spec.dtype))
        result.append(to_numpy(o, spec.dtype))
    return result

  # ---- what it is
  def ops(self) -> list[tuple[str, str, int]]:
    """(domain, op type, opset version) of every op the model uses, each once, sorted."""
    return sorted(set(self.graph.ops()))

  def __repr__(self) -> str:
    ins = ", ".join(f"{s.name}: {s.type_name}{list(s.shape) if s.shape is not None else ''}" for s in self.inputs)
    return f"<OnnxModel ({ins}) -> {len(self.outputs)} output(s), opset {self.opsets.get('', '?')}, on {self.device}>"


def load(source, device: str | None = None, use_jit: bool = True) -> OnnxModel:
  """An ONNX model (a path, bytes or an onnx.ModelProto) ready to run on `device` (default: $UOPC_DEVICE, or C). An op
  or type uopc can't compute raises NotImplementedError naming it."""
  return OnnxModel(read_model(source), device, use_jit)


__all__ = ["load", "OnnxModel", "ValueSpec", "read_model", "prepare_proto", "opsets_of", "infer_types"]
