"""uopc.onnx.cli: the `uopc onnx` command (registered through uopc-tensor's uopc.commands entry point).

    uopc onnx info MODEL.onnx                                   inputs, outputs, opsets, the ops used and which uopc lacks
    uopc onnx run MODEL.onnx [--input NAME=x.npy ...] [--device NAME] [--save out.npz] [--seed N]

`run` feeds each input from its .npy file; an input given none gets random values of its declared type and shape
(symbolic dimensions as 1; said on stderr). It prints each output (name, type, shape, values) and saves them all with
--save (a .npz by output name; a .npy when the model has one output). Errors print one line: the `uopc` command's
convention (an op uopc lacks is one too, naming the op, its domain and version).
"""
from __future__ import annotations
import collections, sys
import numpy as np


class OnnxCLIError(ValueError):
  """A mistake on the command line (a bad --input): a ValueError, which the `uopc` command prints as one line."""


def _nodes(g):
  """Every node of g and of its graph attributes (If branches, Loop bodies), without recursion."""
  import onnx
  todo = [g]
  while todo:
    cur = todo.pop()
    for n in cur.node:
      yield n, cur
      todo.extend(a.g for a in n.attribute if a.type == onnx.AttributeProto.GRAPH)


def support(proto) -> list[tuple[str, str, int, int, str]]:
  """(domain, op, opset, count, '' or why it isn't supported) for every op the model uses."""
  from uopc.onnx.model import opsets_of
  from uopc.onnx.registry import lookup, canonical_domain
  from uopc.onnx.graph import function_graph, type_protos
  opsets = opsets_of(proto)
  counts = collections.Counter()
  first: dict = {}
  for n, g in _nodes(proto.graph):
    key = (canonical_domain(n.domain), n.op_type)
    counts[key] += 1
    first.setdefault(key, (n, g))
  rows = []
  for (domain, op_type), count in sorted(counts.items()):
    opset = opsets.get(domain, 0)
    why = ""
    try:
      if lookup(domain, op_type, opset) is None:
        n, g = first[(domain, op_type)]
        if function_graph(n, domain, opset, type_protos(g), opsets) is None: why = "no handler and no function body"
        else: why = ""
    except NotImplementedError as e: why = str(e).removeprefix("uopc.onnx: ")
    rows.append((domain or "ai.onnx", op_type, opset, count, why))
  return rows


def cmd_info(args) -> int:
  from uopc.onnx.model import read_model, prepare_proto, opsets_of, _spec
  proto = prepare_proto(read_model(args.model))
  g = proto.graph
  inits = {t.name for t in g.initializer}
  fmt = lambda s: f"  {s.name}: {s.type_name} {list(s.shape) if s.shape is not None else '(shape unknown)'}"
  print(f"{args.model}: ir_version {proto.ir_version}, producer {proto.producer_name or '?'} {proto.producer_version}".rstrip())
  print("opsets: " + ", ".join(f"{d or 'ai.onnx'} {v}" for d, v in sorted(opsets_of(proto).items())))
  print("inputs:")
  for vi in g.input:
    if vi.name not in inits: print(fmt(_spec(vi)))
  print("outputs:")
  for vi in g.output: print(fmt(_spec(vi)))
  print(f"initializers: {len(inits)} ({sum(int(np.prod(t.dims)) for t in g.initializer)} values)")
  rows = support(proto)
  print(f"ops ({len(rows)}):")
  for domain, op_type, opset, count, why in rows:
    print(f"  {domain}.{op_type} (opset {opset}) x{count}" + (f"  UNSUPPORTED: {why}" if why else ""))
  missing = [r for r in rows if r[4]]
  print(f"{len(missing)} unsupported op(s)" if missing else "every op is supported")
  return 0


def _random_input(spec, rng: np.random.Generator) -> np.ndarray:
  shape = tuple(d if isinstance(d, int) and d > 0 else 1 for d in (spec.shape or ()))
  if spec.dtype is None: raise NotImplementedError(f"uopc.onnx: input {spec.name!r} is a {spec.type_name}, which uopc doesn't compute")
  if spec.dtype.kind == "f": return rng.standard_normal(shape).astype(spec.dtype)
  if spec.dtype.kind == "b": return rng.random(shape) < 0.5
  return rng.integers(0, 10, shape).astype(spec.dtype)


def cmd_run(args) -> int:
  from uopc.onnx.model import load
  model = load(args.model, device=args.device, use_jit=False)
  given: dict[str, np.ndarray] = {}
  for item in args.input:
    name, sep, path = item.partition("=")
    if not sep or not name or not path: raise OnnxCLIError(f"--input takes NAME=FILE.npy, got {item!r}")
    if name not in {s.name for s in model.inputs}:
      raise OnnxCLIError(f"--input {name}: the model has no input {name!r} (its inputs: {', '.join(s.name for s in model.inputs)})")
    given[name] = np.load(path, allow_pickle=False)
  rng = np.random.default_rng(args.seed)
  for spec in model.inputs:
    if spec.name not in given:
      given[spec.name] = _random_input(spec, rng)
      print(f"uopc onnx: input {spec.name!r} not given: random {given[spec.name].dtype} {list(given[spec.name].shape)}", file=sys.stderr)
  outs = model(**given)
  for spec, o in zip(model.outputs, outs):
    print(f"{spec.name}: {o.dtype} {list(o.shape)}")
    print(np.array2string(o, threshold=64, edgeitems=3))
  if args.save:
    if args.save.endswith(".npy"):
      if len(outs) != 1: raise OnnxCLIError(f"--save {args.save}: the model has {len(outs)} outputs: save them to a .npz")
      np.save(args.save, outs[0])
    else: np.savez(args.save, **{spec.name: o for spec, o in zip(model.outputs, outs)})
  return 0


def _one_line(fn):
  """An op or type uopc lacks is a NotImplementedError, which the `uopc` command doesn't know: one line too (--debug raises)."""
  def run(args) -> int:
    try: return fn(args)
    except (NotImplementedError, ModuleNotFoundError) as e:
      if getattr(args, "debug", False): raise
      missing = isinstance(e, ModuleNotFoundError) and e.name == "onnx"
      print(f"uopc: error: {'uopc onnx needs the onnx package: pip install uopc-tensor[onnx]' if missing else e}", file=sys.stderr)
      return 1
  return run


def register(subparsers) -> None:
  """The `uopc onnx` subcommands (uopc-tensor's uopc.commands entry point)."""
  o = subparsers.add_parser("onnx", help="run an ONNX model or describe it")
  sub = o.add_subparsers(dest="onnx_command", metavar="run|info")
  r = sub.add_parser("run", help="run an ONNX model on inputs from .npy files (random where not given), print and save the outputs")
  r.add_argument("model", help="a .onnx file")
  r.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy", help="an input's values (default: random)")
  r.add_argument("--device", help="the backend to run on (default: $UOPC_DEVICE, or C)")
  r.add_argument("--save", metavar="OUT.npz", help="save the outputs (.npz by output name, or .npy for a single output)")
  r.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
  r.set_defaults(func=_one_line(cmd_run))
  i = sub.add_parser("info", help="inputs, outputs, opsets and ops of an ONNX model, and which ops uopc doesn't support")
  i.add_argument("model", help="a .onnx file")
  i.set_defaults(func=_one_line(cmd_info))
  o.set_defaults(func=lambda args: o.print_help() or 2)
