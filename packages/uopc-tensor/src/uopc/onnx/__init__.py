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
from uopc.onnx.dtypes import OnnxError
from uopc.onnx import ops_math, ops_shape, ops_nn, ops_seq, ops_resize  # noqa: F401  (each registers its handlers)
from uopc.onnx.registry import OPS, lookup
from uopc.onnx.model import load, OnnxModel, ValueSpec

__all__ = ["load", "OnnxModel", "ValueSpec", "OnnxError", "OPS", "lookup"]
