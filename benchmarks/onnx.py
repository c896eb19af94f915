"""ONNX models exported from PyTorch, run by uopc.onnx and by onnxruntime in the same run: time per inference side by side.

    python benchmarks/onnx.py [--calls 30] [--rounds 3] [--warm-cache]

The models (testing/onnx_torch_models.py, torch.onnx.export at opset 17): an MLP (batch 8, 64 -> 256 -> 256 -> 10), a
ResNet-10-like network on 2 images of 32x32, a GPT-2-style decoder (2 layers, width 64, 2 sequences of 32 tokens) and a
2-layer LSTM (4 sequences of 12 steps). uopc serves each through uopc.jit (model(...) from its third call replays the
captured kernels); onnxruntime runs its CPU provider with as many threads as uopc's C backend uses.

Rows: the first call (uopc's compile cache is a fresh directory unless --warm-cache: kernelize, Opts and gcc for every
kernel), the largest difference from onnxruntime relative to its output's magnitude, and the steady time per inference:
the best of --rounds rounds of --calls calls of each in turn (NumPy in, NumPy out for both), and the ratio onnxruntime /
uopc (above 1: uopc is faster).
"""
from __future__ import annotations
import argparse, os, sys, tempfile, time
from pathlib import Path
import numpy as np

# this file is named onnx.py, and python puts its folder first on the path: the onnx package must not resolve to it
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
if "--warm-cache" not in sys.argv and "UOPC_CACHE_DIR" not in os.environ:
  os.environ["UOPC_CACHE_DIR"] = tempfile.mkdtemp(prefix="uopc-bench-cache-")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testing"))
import uopc.onnx                                   # noqa: E402
from uopc.backends import get_backend              # noqa: E402

try:
  import onnxruntime
  import onnx_torch_models
except ImportError as e:   # the reference and the exporter are both needed: say which is missing, run nothing
  print(f"benchmarks/onnx.py needs torch and onnxruntime: {e} (pip install torch onnxruntime)")
  sys.exit(0)


def per_call(fn, feed: dict, calls: int) -> float:
  t = time.perf_counter()
  for _ in range(calls): fn(feed)
  return (time.perf_counter() - t) / calls


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--calls", type=int, default=30)
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--warm-cache", action="store_true", help="keep $UOPC_CACHE_DIR (default: a fresh compile cache)")
  args = ap.parse_args()
  threads = get_backend("C").caps.threads
  print(f"uopc.onnx beside onnxruntime {onnxruntime.__version__} ({threads} threads each), ms per inference after warm-up")
  print(f"{'model':8} {'first call':>11} {'rel diff':>9} {'uopc':>9} {'onnxruntime':>12} {'ort/uopc':>9}")
  for name, (blob, feed) in onnx_torch_models.models().items():
    model = uopc.onnx.load(blob)
    opts = onnxruntime.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")   # its idle threads would spin on uopc's cores
    session = onnxruntime.InferenceSession(blob, opts, providers=["CPUExecutionProvider"])
    t = time.perf_counter()
    ours = model(**feed)
    first = time.perf_counter() - t
    ref = session.run(None, feed)
    diff = max(float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)) for a, b in zip(ours, ref))
    uopc_call, ort_call = (lambda f: model(**f)), (lambda f: session.run(None, f))
    for _ in range(3): uopc_call(feed); ort_call(feed)   # uopc.jit: run, capture, replay
    best_uopc = best_ort = float("inf")
    for _ in range(args.rounds):
      best_uopc = min(best_uopc, per_call(uopc_call, feed, args.calls))
      best_ort = min(best_ort, per_call(ort_call, feed, args.calls))
    print(f"{name:8} {first:10.2f}s {diff:9.1e} {best_uopc * 1e3:9.3f} {best_ort * 1e3:12.3f} {best_ort / best_uopc:8.2f}x")


if __name__ == "__main__":
  main()
