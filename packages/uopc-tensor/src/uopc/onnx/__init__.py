"""uopc.onnx: ONNX models on uopc. `load` reads a model with the `onnx` package and returns an object that runs it:
every ONNX op becomes Tensor ops, so the whole graph compiles through kernelize like any Tensor program.

    import uopc.onnx
    model = uopc.onnx.load("model.onnx")          # or bytes, or an onnx.ModelProto
    outputs = model(x)                             # NumPy arrays or Tensors, by position or name; NumPy arrays back

The modules, in the order a call meets them:

    model      load, OnnxModel: inputs checked against the graph, outputs in their declared types, serving under uopc.jit
    graph      the interpreter: each node's handler, host values for shapes, ops ONNX defines as functions of others
    registry   the op table keyed by (domain, op type), each handler by the schema version it starts at
    fold       shape arithmetic on host values, exact in int64
    dtypes     ONNX's types on uopc's bool, i32, f16, f32 (wrapped, checked or refused); OnnxError
    ops_*      the handlers: math (elementwise, Cast), shape (movement, indexing), nn (products, convolutions, pooling,
               normalization, softmax, reductions), seq (recurrent ops, If, Loop, quantization, attention)
    backend    ONNX's backend API, for onnx.backend.test
    cli        `uopc onnx run` and `uopc onnx info`

An op, attribute or type uopc doesn't implement raises NotImplementedError naming it (with the op's domain and opset
version): never a wrong answer.
"""
import importlib

# the names below import the onnx package when first used, so that `uopc` (whose `uopc onnx` subcommand lives in
# uopc.onnx.cli) starts without the onnx extra installed and says what is missing only when asked to run a model
_HOMES = {"load": "model", "OnnxModel": "model", "ValueSpec": "model", "OnnxError": "dtypes", "OPS": "registry", "lookup": "registry"}


def __getattr__(name: str):
  if name not in _HOMES: raise AttributeError(f"module 'uopc.onnx' has no attribute {name!r}")
  try: module = importlib.import_module(f"uopc.onnx.{_HOMES[name]}")
  except ModuleNotFoundError as e:
    if e.name != "onnx": raise
    raise ModuleNotFoundError("uopc.onnx needs the onnx package: pip install 'uopc-tensor[onnx]'", name="onnx") from None
  if name in ("OPS", "lookup"): importlib.import_module("uopc.onnx.model")   # the handlers register themselves on import
  return getattr(module, name)


__all__ = list(_HOMES)
