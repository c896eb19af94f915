"""Models exported from PyTorch with torch.onnx.export (an MLP, a small ResNet, a small GPT-2-style decoder, a 2-layer
LSTM: testing/onnx_torch_models.py) run by uopc.onnx and by onnxruntime on the same inputs: every output within 1e-4
of onnxruntime's, relative to its largest magnitude, and the same again on the calls uopc.jit replays. Run by
`nox -s onnx_full`, which installs torch 2.13.0 and onnxruntime (the `onnx` session leaves this file out)."""
import numpy as np
import onnxruntime
import pytest
import uopc.onnx
import onnx_torch_models

MODELS = onnx_torch_models.models()


def close(ours: np.ndarray, ref: np.ndarray) -> None:
  assert ours.dtype == ref.dtype and ours.shape == ref.shape
  np.testing.assert_allclose(ours, ref, rtol=1e-4, atol=1e-4 * float(np.abs(ref).max()))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_model_matches_onnxruntime(name):
  blob, inputs = MODELS[name]
  model = uopc.onnx.load(blob)
  session = onnxruntime.InferenceSession(blob, providers=["CPUExecutionProvider"])
  rng = np.random.default_rng(1)
  for call in range(4):   # the first plainly, then uopc.jit's run, capture and a replay, each on new inputs
    feed = {k: (rng.standard_normal(v.shape).astype(v.dtype) if v.dtype.kind == "f" else rng.integers(0, 96, v.shape).astype(v.dtype))
            for k, v in inputs.items()} if call else inputs
    for ours, ref in zip(model(**feed), session.run(None, feed)): close(ours, ref)
  assert model.interpreted == 3   # the fourth call replayed the captured kernels
