"""uopc.onnx.registry: the op table, keyed by (domain, op type), each op's handlers by the opset version they start at.

An ONNX op changes with its version (Softmax's axis, Slice's attributes becoming inputs, Clip's bounds): each version is
a schema with a `since_version`. A handler is registered for the schema version it starts at, and `lookup` finds the
schema in force for the model's opset (onnx.defs) and the newest handler that starts at or before it:

    @op("Softmax", since=1)          def softmax_1(ctx, x, axis=1): ...      # flatten at axis, softmax, back
    @op("Softmax", since=13)         def softmax_13(ctx, x, axis=-1): ...    # along one axis

A handler is `fn(ctx, *inputs, **attributes)`: the inputs as Tensors (None for a missing optional one), except those
named in `const`, which come as NumPy arrays of their declared type (shape-like inputs: Reshape's shape, Slice's starts);
the attributes as keywords with the op's defaults in the signature, so an attribute the handler doesn't know is an
error (NotImplementedError), never ignored. `ctx` (graph.NodeContext) says the op's version and the declared types of
its inputs and outputs. A handler returns a Tensor, a NumPy array (a host value, for shape computations), or a tuple of
them per output. `exact` marks ops that only move values (no wrapping of narrow integers needed after them).

Versions newer than REVIEWED (the opsets of onnx 1.23.2, which this table was checked against) raise
NotImplementedError: a future version may change the meaning, and a wrong answer is worse than none.
"""
from __future__ import annotations
from typing import Callable, NamedTuple
import onnx.defs

# the newest opset of each domain this table was checked against (onnx 1.23.2)
REVIEWED = {"": 28, "ai.onnx.ml": 5, "ai.onnx.preview.training": 1, "ai.onnx.preview": 1}


class Handler(NamedTuple):
  fn: Callable
  since: int
  const: tuple[int, ...]
  exact: bool
  attrs: frozenset | None    # the attributes a handler taking **attrs knows (None: its signature says)


OPS: dict[tuple[str, str], list[Handler]] = {}


def canonical_domain(domain: str) -> str: return "" if domain in ("", "ai.onnx") else domain


def op(names: str, since: int = 1, const: tuple[int, ...] = (), exact: bool = False, domain: str = "", attrs=None):
  """Register the decorated function as the handler of each op in `names` (space-separated) from schema version `since`.
  A handler that takes **attrs names the attributes it knows in `attrs`."""
  def register(fn: Callable) -> Callable:
    for name in names.split():
      entries = OPS.setdefault((domain, name), [])
      if any(h.since == since for h in entries): raise ValueError(f"uopc.onnx: {domain or 'ai.onnx'}.{name} version {since} registered twice")
      entries.append(Handler(fn, since, const, exact, frozenset(attrs) if attrs is not None else None))
      entries.sort(key=lambda h: h.since)
    return fn
  return register


def schema_version(domain: str, op_type: str, opset: int) -> int | None:
  """The since_version of the schema of op_type in force at `opset`; None when onnx has no schema for it."""
  try: return onnx.defs.get_schema(op_type, opset, domain).since_version
  except onnx.defs.SchemaError: return None


def unsupported(domain: str, op_type: str, opset: int, why: str = "") -> NotImplementedError:
  return NotImplementedError(f"uopc.onnx: op {op_type} of domain {domain or 'ai.onnx'} at opset version {opset} is not supported"
                             + (f" ({why})" if why else ""))


def lookup(domain: str, op_type: str, opset: int) -> Handler | None:
  """The handler for op_type at the model's opset of its domain; None when there is none (the caller may expand the op's
  function). NotImplementedError for a version newer than this table was checked against."""
  domain = canonical_domain(domain)
  entries = OPS.get((domain, op_type))
  if not entries: return None
  version = schema_version(domain, op_type, opset)
  if version is None: version = opset
  if domain in REVIEWED and version > REVIEWED[domain]:
    raise unsupported(domain, op_type, opset, f"its schema version {version} is newer than the {REVIEWED[domain]} uopc was checked against")
  fitting = [h for h in entries if h.since <= version]
  return fitting[-1] if fitting else None
