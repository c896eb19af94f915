"""uopc.onnx.graph: an ONNX graph as a list of steps, and the interpreter that turns one call into a Tensor graph.

`Graph` is built once per GraphProto (the model's, an If branch's, a Loop body's, an op's function body): each node
becomes a Step with its handler (uopc.onnx.registry), its attributes parsed, and the declared types of its inputs and
outputs (from ONNX's type inference, which the model ran). A node whose op has no handler but whose schema defines it as
a function of other ops (Celu, LayerNormalization, Range, ...) runs that function body as a Graph of its own: "the
functions ONNX defines by expansion". Anything else is a NotImplementedError naming the op, its domain and version,
raised when the graph is built, before any input is seen.

`Graph.run` interprets the steps over an `Env`, which maps each value's name to a Tensor (lazy: nothing runs here) or
to a NumPy array of its declared type (a host value). Host values are what ONNX computes on shapes: initializers,
Constant nodes, Shape and Size, and every op of uopc.onnx.fold whose inputs are all such *static* values (known without
reading any input's data), computed exactly in their declared type (int64 shape arithmetic never passes through i32).
A handler's shape-like inputs (`const`) are read as host values; one that is a Tensor is read from the device (a
graph input passed as NumPy is read from its host copy instead). Everything else becomes a Tensor (an initializer
once per model: `Graph.constants`), and the whole call compiles through kernelize like any Tensor program.
"""
from __future__ import annotations
import inspect, itertools
from typing import Any
import numpy as np
import onnx
from onnx import helper, numpy_helper, AttributeProto, GraphProto, NodeProto, TensorProto
from uopc.tensor import Tensor
from uopc.onnx.dtypes import OnnxError, np_type, to_tensor, to_numpy, settle, CANONICAL, compute_dtype
from uopc.onnx.registry import Handler, lookup, canonical_domain, unsupported, schema_version
from uopc.onnx import fold

SHAPE_OPS = ("Shape", "Size")   # host results that read only their input's shape: static whatever the input


def attribute_value(a: AttributeProto) -> Any:
  """An attribute as a Python value: numbers, str (from bytes), lists, NumPy arrays for tensors, GraphProto for graphs."""
  if a.type == AttributeProto.STRING: return a.s.decode("utf-8", "replace")
  if a.type == AttributeProto.STRINGS: return [s.decode("utf-8", "replace") for s in a.strings]
  if a.type == AttributeProto.TENSOR: return host_tensor(a.t, f"attribute {a.name}")
  if a.type in (AttributeProto.FLOATS, AttributeProto.INTS): return list(helper.get_attribute_value(a))
  if a.type in (AttributeProto.SPARSE_TENSOR, AttributeProto.TENSORS, AttributeProto.SPARSE_TENSORS, AttributeProto.TYPE_PROTO,
                AttributeProto.TYPE_PROTOS, AttributeProto.GRAPHS):
    raise NotImplementedError(f"uopc.onnx: attribute {a.name} of type {AttributeProto.AttributeType.Name(a.type)} is not supported")
  return helper.get_attribute_value(a)


def host_tensor(t: TensorProto, what: str) -> np.ndarray:
  """A TensorProto's value as a NumPy array of its type (NotImplementedError for a type uopc doesn't compute)."""
  want = np_type(t.data_type)
  arr = numpy_helper.to_array(t)
  return arr if arr.dtype == want else arr.astype(want)


def value_types(g: GraphProto) -> dict[str, np.dtype | None]:
  """The declared element type of every value the graph describes (inputs, outputs, inferred value_info): None for one
  whose type isn't a tensor of a type uopc computes, or isn't known."""
  types: dict[str, np.dtype | None] = {}
  for vi in itertools.chain(g.input, g.output, g.value_info):
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    try: types[vi.name] = np_type(tt.elem_type) if tt is not None and tt.elem_type else None
    except NotImplementedError: types[vi.name] = None
  for t in g.initializer:
    try: types[t.name] = np_type(t.data_type)
    except NotImplementedError: types[t.name] = None
  return types


def type_protos(g: GraphProto) -> dict[str, onnx.TypeProto]:
  """The TypeProto (element type and shape, as inference left them) of every value the graph describes."""
  return {vi.name: vi.type for vi in itertools.chain(g.input, g.output, g.value_info) if vi.type.WhichOneof("value")}


def check_value_types(g: GraphProto, names) -> None:
  """NotImplementedError for a value of a type uopc can't compute (strings, bfloat16, float8, sequences, ...), named."""
  by_name = {vi.name: vi for vi in itertools.chain(g.input, g.output, g.value_info)}
  for name in names:
    vi = by_name.get(name)
    if vi is None: continue
    kind = vi.type.WhichOneof("value")
    if kind is None: continue   # no type given: the value's own decides
    if kind != "tensor_type": raise NotImplementedError(f"uopc.onnx: value {name!r} is a {kind}, not a tensor: uopc computes tensors only")
    if vi.type.tensor_type.elem_type: np_type(vi.type.tensor_type.elem_type)


class Env:
  """The values of one run of a graph, by name, looked up through the enclosing graphs' (a subgraph reads outer values).
  A value is a Tensor or a NumPy array of its declared type; `static` names the host values known without reading any
  input's data; `hosts` keeps the host copies of inputs given as NumPy (read for shape-like inputs without a device read)."""
  def __init__(self, device: str, parent: Env | None = None):
    self.device, self.parent = device, parent
    self.values: dict[str, Tensor | np.ndarray | None] = {}
    self.types: dict[str, np.dtype | None] = {}
    self.static: set[str] = set()
    self.hosts: dict[str, np.ndarray] = {}
    self.converted: dict[str, Tensor] = {}
    self.host_reads: set[str] = set()   # the Tensor values read as host values (the model's inputs among them decide jit keys)

  def _owner(self, name: str) -> Env:
    env: Env | None = self
    while env is not None:
      if name in env.values: return env
      env = env.parent
    raise OnnxError(f"value {name!r} is used before any node or input defines it")

  def set(self, name: str, value, declared: np.dtype | None, static: bool = False) -> None:
    self.values[name], self.types[name] = value, declared
    if static: self.static.add(name)

  def declared(self, name: str) -> np.dtype | None: return self._owner(name).types.get(name)
  def is_static(self, name: str) -> bool:
    env = self._owner(name)
    return name in env.static
  def is_host(self, name: str) -> bool: return isinstance(self._owner(name).values[name], np.ndarray)

  def tensor(self, name: str, constants: dict[str, Tensor]) -> Tensor | None:
    env = self._owner(name)
    v = env.values[name]
    if v is None or isinstance(v, Tensor): return v
    if name in constants: return constants[name]
    # a host value is static (an initializer, a Constant, shape arithmetic on them): one element of it is a constant
    if name not in env.converted: env.converted[name] = to_tensor(v, env.types.get(name), self.device, f"value {name!r}", constant=True)
    return env.converted[name]

  def host(self, name: str) -> np.ndarray | None:
    env = self._owner(name)
    v = env.values[name]
    if v is None or isinstance(v, np.ndarray): return v
    root = self
    while root.parent is not None: root = root.parent
    root.host_reads.add(name)
    if name in env.hosts: return env.hosts[name]
    return to_numpy(v, env.types.get(name))


class NodeContext:
  """What a handler may know beyond its inputs and attributes: the op and its opset version, the declared types of its
  inputs and outputs, how many outputs the node asks for, the device, and a way to run a graph attribute."""
  def __init__(self, step: Step, env: Env, graph: Graph, fresh: set[str] | frozenset = frozenset()):
    self.step, self.env, self.graph = step, env, graph
    self.fresh = fresh   # initializers made Tensors for this node's inputs just now (none before it used them)
    self.op, self.domain, self.version = step.node.op_type, step.domain, step.opset
    self.in_types, self.out_types = step.in_types, step.out_types
    self.n_outputs = len(step.node.output)
    self.device = env.device

  def wants(self, i: int) -> bool:
    """Whether the node names output i (an optional output left out is not computed)."""
    return i < self.n_outputs and self.step.node.output[i] != ""

  def known(self, i: int) -> np.ndarray | None:
    """Input i's value when it is held on the host (no device read), else None."""
    name = self.step.node.input[i] if i < len(self.step.node.input) else ""
    if not name: return None
    owner = self.env._owner(name)
    v = owner.values[name]
    return v if isinstance(v, np.ndarray) else owner.hosts.get(name)

  def host(self, i: int) -> np.ndarray | None:
    """Input i's value as a host array (read from the device when it is a Tensor)."""
    name = self.step.node.input[i] if i < len(self.step.node.input) else ""
    return self.env.host(name) if name else None

  def transposed_initializer(self, i: int, axes: tuple[int, ...] = (1, 0)) -> Tensor | None:
    """Input i permuted by `axes` (a 2-D transpose by default) as a Tensor of its own, made once per model, when input i
    is an initializer of this graph of that rank; else None. A weight read through a transposed view (a Gemm's with
    transB, as torch exports every Linear; an LSTM's W and R) makes each output a dot product that ends in a horizontal
    sum of vector lanes, 2.5x slower than a GEMM along contiguous rows."""
    name = self.step.node.input[i] if i < len(self.step.node.input) else ""
    if not name or name not in self.graph.initializers or not self.env.is_host(name): return None
    constants, key = self.graph._constants(self.device), f"{name}\0transposed{axes}"
    if key not in constants:
      arr = self.env.host(name)
      if arr.ndim != len(axes): return None
      constants[key] = to_tensor(np.ascontiguousarray(arr.transpose(axes)), self.env.declared(name), self.device, f"initializer {name!r} transposed")
    # the untransposed copy made for this node alone is not kept (a node that reads it later makes it again)
    if name in self.fresh: del constants[name]
    return constants[key]

  def run_graph(self, g: GraphProto, inputs: list) -> list:
    """Run a graph attribute (If's branches, Loop's body) with these inputs (Tensors or host arrays) in a scope inside this one."""
    sub = self.graph.subgraph(g)
    return sub.run(Env(self.env.device, self.env), inputs)

  def tensor(self, x, declared: np.dtype | None = None) -> Tensor:
    """A host value (or number) as a Tensor on the node's device."""
    if isinstance(x, Tensor): return x
    arr = np.asarray(x)
    return to_tensor(arr, declared or arr.dtype, self.device, f"{self.op}'s value", constant=True)


class Step:
  """One node to run: its handler or its function body, its attributes parsed, its opset version and declared types."""
  __slots__ = ("node", "domain", "opset", "handler", "function", "attrs", "in_types", "out_types")

  def __init__(self, node: NodeProto, opsets: dict[str, int], types: dict[str, np.dtype | None], protos: dict[str, onnx.TypeProto]):
    self.node, self.domain = node, canonical_domain(node.domain)
    if self.domain not in opsets: raise OnnxError(f"node {node.name or node.op_type!r} uses domain {node.domain!r}, which the model doesn't import")
    self.opset = opsets[self.domain]
    self.attrs = {a.name: attribute_value(a) for a in node.attribute}
    self.in_types = [types.get(n) if n else None for n in node.input]
    self.out_types = [types.get(n) if n else None for n in node.output]
    self.function: Graph | None = None
    self.handler: Handler | None = lookup(self.domain, node.op_type, self.opset)
    if self.handler is None:
      self.function = function_graph(node, self.domain, self.opset, protos, opsets)
      if self.function is None: raise unsupported(self.domain, node.op_type, self.opset)
      return
    params = inspect.signature(self.handler.fn).parameters
    takes_any = any(q.kind is q.VAR_KEYWORD for q in params.values())
    for name in self.attrs:
      known = name in self.handler.attrs if takes_any and self.handler.attrs is not None else \
        takes_any or (name in params and params[name].kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
      if not known or name == "ctx": raise unsupported(self.domain, node.op_type, self.opset, f"attribute {name!r} is not supported")



def function_graph(node: NodeProto, domain: str, opset: int, protos: dict[str, onnx.TypeProto], opsets: dict[str, int]) -> Graph | None:
  """The function body ONNX's schema defines node's op by, at this opset, as a Graph whose inputs and outputs are the
  function's (None when the schema has no function). Attributes the body refers to (ref_attr_name) take the node's values,
  or the schema's defaults. A context-dependent function (built for the node's input types and ranks) needs them known."""
  version = schema_version(domain, node.op_type, opset)
  if version is None: return None
  schema = onnx.defs.get_schema(node.op_type, opset, domain)
  node = _with_defaults(node, schema)
  body = None
  fn_versions = [v for v in schema.function_opset_versions if v <= opset] if schema.has_function else []
  if fn_versions: body = onnx.FunctionProto.FromString(schema.get_function_with_opset_version(max(fn_versions)))
  elif schema.has_context_dependent_function:
    cd_versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if not cd_versions: return None
    in_types = []
    for n in node.input:
      if n and n not in protos: return None   # the function depends on its input types, which aren't known
      in_types.append(protos[n].SerializeToString() if n else onnx.TypeProto().SerializeToString())
    try: body = onnx.FunctionProto.FromString(schema.get_context_dependent_function_with_opset_version(max(cd_versions),
                                                                                                    node.SerializeToString(), in_types))
    except Exception as e: raise unsupported(domain, node.op_type, opset, f"its function body could not be built: {e}") from None
    if not body.node: return None
  if body is None: return None
  attrs = {a.name: a for a in node.attribute}
  nodes = []
  for n in body.node:
    m = NodeProto()
    m.CopyFrom(n)
    del m.attribute[:]
    for a in n.attribute:
      if a.ref_attr_name:
        if a.ref_attr_name not in attrs: continue   # an optional attribute the node leaves out
        b = AttributeProto()
        b.CopyFrom(attrs[a.ref_attr_name])
        b.name = a.name
        m.attribute.append(b)
      else: m.attribute.append(a)
    nodes.append(m)
  inputs = []
  for name, outer in zip(body.input, list(node.input) + [""] * len(body.input)):
    vi = onnx.ValueInfoProto(name=name)
    if outer and outer in protos: vi.type.CopyFrom(protos[outer])
    inputs.append(vi)
  g = helper.make_graph(nodes, f"{node.op_type}_function", inputs, [helper.make_value_info(o, onnx.TypeProto()) for o in body.output])
  imports = dict(opsets)
  imports.update({canonical_domain(o.domain): o.version for o in body.opset_import})
  typed = infer_types(g, imports)
  return Graph(typed, imports, inputs=list(body.input)[:len(node.input)], function=True)


def _with_defaults(node: NodeProto, schema) -> NodeProto:
  """node with the schema's default attribute values added for those it leaves out (function bodies refer to them)."""
  out = NodeProto()
  out.CopyFrom(node)
  have = {a.name for a in node.attribute}
  for name, a in schema.attributes.items():
    if name not in have and a.default_value and a.default_value.type: out.attribute.append(a.default_value)
  return out


def infer_types(g: GraphProto, opsets: dict[str, int]) -> GraphProto:
  """g with ONNX's type inference run over it (value_info filled in); g itself where inference fails."""
  model = helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
  model.ir_version = min(model.ir_version, 10)
  try: return onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
  except Exception: return g


class Graph:
  """A GraphProto ready to run: its steps, initializers (host values, and Tensors once made: `constants`), inputs and
  outputs with their declared types."""
  def __init__(self, g: GraphProto, opsets: dict[str, int], inputs: list[str] | None = None, function: bool = False):
    self.proto, self.opsets, self.function = g, opsets, function
    self.types = value_types(g)
    self.protos = type_protos(g)
    self.initializers = {t.name: host_tensor(t, f"initializer {t.name!r}") for t in g.initializer}
    self.inputs = inputs if inputs is not None else [i.name for i in g.input if i.name not in self.initializers]
    self.outputs = [o.name for o in g.output]
    check_value_types(g, [*self.inputs, *self.outputs])
    self.steps = [Step(n, opsets, self.types, self.protos) for n in g.node]
    self.constants: dict[str, Tensor] = {}       # initializers as Tensors, made once
    self._subgraphs: dict[int, tuple[GraphProto, Graph]] = {}

  def subgraph(self, g: GraphProto) -> Graph:
    if id(g) not in self._subgraphs: self._subgraphs[id(g)] = (g, Graph(g, self.opsets))   # the proto is kept, so its id stays its own
    return self._subgraphs[id(g)][1]

  def ops(self) -> list[tuple[str, str, int]]:
    """(domain, op type, opset) of every node, with the nodes of graph attributes and function bodies."""
    out, todo = [], [self]
    while todo:
      g = todo.pop()
      for s in g.steps:
        out.append((s.domain, s.node.op_type, s.opset))
        if s.function is not None: todo.append(s.function)
        todo.extend(g.subgraph(v) for v in s.attrs.values() if isinstance(v, GraphProto))
    return out

  def run(self, env: Env, inputs: list, static: list[bool] | None = None) -> list:
    """Bind `inputs` (Tensors, host arrays or None, in the order of self.inputs; `static` says which host arrays are
    static values) and interpret every step; the outputs."""
    if len(inputs) > len(self.inputs): raise OnnxError(f"{len(inputs)} inputs for a graph of {len(self.inputs)}")
    for k, (name, v) in enumerate(zip(self.inputs, inputs)):
      env.set(name, v, self.types.get(name) if self.types.get(name) is not None else _type_of(v), bool(static and static[k]))
    for name in self.inputs[len(inputs):]: env.set(name, None, None)
    for name, arr in self.initializers.items():
      if name not in self.inputs: env.set(name, arr, self.types.get(name), static=True)
    constants = self._constants(env.device)
    for step in self.steps: self._run_step(step, env, constants)
    # a function body leaves the outputs the calling node doesn't ask for (Attention's present_key) undefined
    return [None if self.function and o not in env.values else env.values[o] if o in env.values else env.tensor(o, constants) for o in self.outputs]

  def _constants(self, device: str) -> dict[str, Tensor]:
    if self.constants and next(iter(self.constants.values())).device != device: self.constants = {}
    return self.constants

  def _run_step(self, step: Step, env: Env, constants: dict[str, Tensor]) -> None:
    node = step.node
    names = list(node.input)
    present = [n for n in names if n]
    static = all(env.is_static(n) for n in present)
    if step.function is not None:
      outs = step.function.run(Env(env.device), [_raw(env, n) if n else None for n in names], [bool(n) and env.is_static(n) for n in names])
      self._bind(step, env, outs, [static and isinstance(o, np.ndarray) for o in outs])
      return
    handler = step.handler
    fold_fn = fold.FOLDS.get(node.op_type)
    if fold_fn is not None and present and static and all(env.is_host(n) for n in present):
      try: outs = fold_fn(*[env.host(n) if n else None for n in names], **step.attrs)
      except (TypeError, ValueError, IndexError): outs = NotImplemented   # a case the fold doesn't know: the handler's
      if outs is not NotImplemented:
        outs = outs if isinstance(outs, tuple) else (outs,)
        self._bind(step, env, list(outs), [True] * len(outs))
        return
    args, fresh = [], set()
    for i, n in enumerate(names):
      if not n: args.append(None)
      elif i in handler.const: args.append(env.host(n))
      else:
        if n not in constants and env.is_host(n) and n in self.initializers:
          constants[n] = env.tensor(n, {})
          fresh.add(n)
        args.append(env.tensor(n, constants))
    ctx = NodeContext(step, env, self, fresh)
    outs = handler.fn(ctx, *args, **step.attrs)
    outs = list(outs) if isinstance(outs, (tuple, list)) else [outs]
    shape_only = node.op_type in SHAPE_OPS
    host_static = static and all(i in handler.const for i, n in enumerate(names) if n)
    self._bind(step, env, outs, [isinstance(o, np.ndarray) and (shape_only or host_static) for o in outs])

  def _bind(self, step: Step, env: Env, outs: list, static: list[bool]) -> None:
    node = step.node
    if len(outs) < sum(1 for o in node.output if o):
      n_needed = max(i for i, o in enumerate(node.output) if o) + 1
      if len(outs) < n_needed: raise OnnxError(f"{node.op_type} gave {len(outs)} outputs, the node names {n_needed}")
    exact = step.handler.exact if step.handler is not None else True
    for i, name in enumerate(node.output):
      if not name: continue
      v, declared = outs[i], step.out_types[i]
      if isinstance(v, np.generic): v = np.asarray(v)
      if isinstance(v, np.ndarray):
        if declared is None: declared = v.dtype if v.dtype in CANONICAL.values() or v.dtype.kind in "iufb" else None
        env.set(name, v.astype(declared) if declared is not None and v.dtype != declared else v, declared, static[i])
      elif isinstance(v, Tensor):
        if declared is None: declared = _fallback_type(v, step.in_types)
        env.set(name, settle(v, declared, exact), declared)
      elif v is None: env.set(name, None, None)
      else: raise OnnxError(f"{node.op_type}'s handler returned {type(v).__name__} for output {i}")


def _raw(env: Env, name: str):
  """A value as it is held (Tensor or host array), for binding to a function body's inputs."""
  owner = env._owner(name)
  return owner.values[name]


def _type_of(v) -> np.dtype | None:
  if isinstance(v, np.ndarray): return v.dtype
  if isinstance(v, Tensor): return CANONICAL[v.dtype]
  return None


def _fallback_type(t: Tensor, in_types: list[np.dtype | None]) -> np.dtype:
  """A result's type where inference gave none: its first input's when it computes in the same dtype, else uopc's canonical."""
  first = next((d for d in in_types if d is not None), None)
  if first is not None and compute_dtype(first) is t.dtype: return first
  return CANONICAL[t.dtype]
