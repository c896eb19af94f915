"""`uopc onnx run` and `uopc onnx info`, through the `uopc` command's parser (the uopc.commands entry point)."""
import numpy as np
import onnx
from onnx import TensorProto, helper
from uopc.cli import main
from test_onnx_model import mlp, model_of, vi


def test_run_reads_inputs_and_saves_outputs(tmp_path, capsys):
  path, x, out = tmp_path / "mlp.onnx", tmp_path / "x.npy", tmp_path / "out.npz"
  onnx.save(mlp(), str(path))
  xs = np.arange(6, dtype=np.float32).reshape(2, 3)
  np.save(x, xs)
  assert main(["onnx", "run", str(path), "--input", f"x={x}", "--save", str(out)]) == 0
  want = np.maximum(xs @ (np.arange(12, dtype=np.float32).reshape(3, 4) / 10) + np.array([1, -1, 0.5, 0], np.float32), 0)
  np.testing.assert_allclose(np.load(out)["y"], want, rtol=1e-6)
  assert "y: float32 [2, 4]" in capsys.readouterr().out


def test_run_fills_missing_inputs_and_refuses_unknown_ones(tmp_path, capsys):
  path = tmp_path / "mlp.onnx"
  onnx.save(mlp(), str(path))
  assert main(["onnx", "run", str(path)]) == 0
  assert "input 'x' not given: random float32 [1, 3]" in capsys.readouterr().err
  assert main(["onnx", "run", str(path), "--input", "nope=x.npy"]) == 1
  assert "the model has no input 'nope'" in capsys.readouterr().err


def test_info_lists_ops_and_names_the_unsupported(tmp_path, capsys):
  m = model_of([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Det", ["r"], ["y"])], [vi("x", TensorProto.FLOAT, [2, 2])],
               [vi("y", TensorProto.FLOAT, [])])
  path = tmp_path / "det.onnx"
  onnx.save(m, str(path))
  assert main(["onnx", "info", str(path)]) == 0
  out = capsys.readouterr().out
  assert "x: FLOAT [2, 2]" in out and "ai.onnx.Relu (opset 21) x1\n" in out
  assert "ai.onnx.Det (opset 21) x1  UNSUPPORTED" in out and "1 unsupported op(s)" in out
  assert main(["onnx", "run", str(path)]) == 1
  assert "op Det of domain ai.onnx at opset version 21 is not supported" in capsys.readouterr().err
