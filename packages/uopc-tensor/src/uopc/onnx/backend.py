"""uopc.onnx.backend: ONNX's backend API on uopc, so `onnx.backend.test.BackendTest` runs ONNX's own node tests here.

    import uopc.onnx.backend as backend
    rep = backend.prepare(model, "CPU")          # an onnx.ModelProto (or a path); "CPU" is uopc's C backend
    outputs = rep.run([x, y])                    # a list of NumPy arrays, in the graph's order
    backend.run_node(node, [x, y])               # one NodeProto on its own

Devices are ONNX's names: "CPU" runs on uopc's C backend, "CUDA" on its CUDA backend where a GPU answers. The model runs
through uopc.onnx.load, so an op uopc doesn't implement raises NotImplementedError naming it.
"""
from __future__ import annotations
from typing import Any
import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep
from uopc.onnx.model import load, OnnxModel, read_model

DEVICES = {"CPU": "C", "CUDA": "CUDA"}


def _uopc_device(device: str) -> str:
  name = str(device).split(":")[0].upper()
  if name not in DEVICES: raise ValueError(f"uopc.onnx.backend: unknown device {device!r} (expected CPU or CUDA)")
  return DEVICES[name]


class UopcRep(BackendRep):
  """A prepared model: run(inputs) takes the graph's inputs in order (a list or tuple), or by name (a dict)."""
  def __init__(self, model: OnnxModel):
    super().__init__()
    self.model = model

  def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
    if isinstance(inputs, dict): return tuple(self.model(**inputs))
    if isinstance(inputs, np.ndarray) and len(self.model.inputs) == 1: inputs = [inputs]
    return tuple(self.model(*inputs))


class UopcBackend(Backend):
  @classmethod
  def supports_device(cls, device: str) -> bool:
    try: name = _uopc_device(device)
    except ValueError: return False
    if name == "C": return True
    try:
      from uopc.backends import get_backend
      get_backend(name).alloc(1, __import__("uopc.dtype", fromlist=["dtypes"]).dtypes.f32)
      return True
    except Exception: return False

  @classmethod
  def prepare(cls, model, device: str = "CPU", **kwargs: Any) -> UopcRep:
    return UopcRep(load(read_model(model), device=_uopc_device(device), use_jit=kwargs.get("use_jit", False)))

  @classmethod
  def run_model(cls, model, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
    return cls.prepare(model, device, **kwargs).run(inputs)

  @classmethod
  def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU", outputs_info=None, **kwargs: Any) -> tuple[np.ndarray, ...]:
    """One node on its own: a graph of it whose inputs take the types and shapes of `inputs`."""
    arrays = [np.asarray(x) for x in inputs]
    ins = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for name, a in zip(node.input, arrays) if name]
    outs = [helper.make_value_info(name, onnx.TypeProto()) for name in node.output if name]
    opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
    model = helper.make_model(helper.make_graph([node], "node", ins, outs), opset_imports=[helper.make_opsetid(node.domain, opset)])
    return cls.prepare(model, device).run([a for name, a in zip(node.input, arrays) if name])


prepare = UopcBackend.prepare
run_model = UopcBackend.run_model
run_node = UopcBackend.run_node
supports_device = UopcBackend.supports_device
