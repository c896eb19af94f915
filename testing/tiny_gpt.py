"""A tiny uopc.gpt training step on a chosen device, shared by the GPU suite (packages/uopc-tensor/tests_gpu) and the
SASS checks (testing/sass.py): embeddings, LayerNorm, causal attention, a GELU MLP, cross-entropy and AdamW."""
from __future__ import annotations
import contextlib, os
from collections.abc import Iterator
import numpy as np


@contextlib.contextmanager
def on_device(name: str) -> Iterator[None]:
  """UOPC_DEVICE=name inside the block (tensors made there, parameters included, live on that backend), as it was after."""
  prev = os.environ.get("UOPC_DEVICE")
  os.environ["UOPC_DEVICE"] = name
  try: yield
  finally:
    if prev is None: os.environ.pop("UOPC_DEVICE", None)
    else: os.environ["UOPC_DEVICE"] = prev


def tiny_gpt_step(device: str) -> np.ndarray:
  """One seeded training step of a 1-layer, width-16 GPT on `device`: its loss and the first block's attention weight
  after the AdamW update, as one array."""
  from uopc import nn
  from uopc.gpt import GPT, GPTConfig
  from uopc.tensor import Tensor
  with on_device(device):
    Tensor.manual_seed(0)
    model = GPT(GPTConfig(vocab=13, context=8, layers=1, width=16, heads=2))
    opt = nn.AdamW(model.parameters(), lr=0.01)
    tokens = np.random.default_rng(20).integers(0, 13, (2, 9)).astype(np.int32)
    opt.zero_grad()
    loss = model.loss(Tensor(tokens[:, :-1]), Tensor(tokens[:, 1:]))
    loss.backward()
    opt.step()
    return np.concatenate([loss.numpy().reshape(1), model.blocks[0].attn.weight.numpy().ravel()])
