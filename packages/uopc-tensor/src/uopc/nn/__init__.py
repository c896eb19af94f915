"""uopc.nn: layers, optimizers and state dicts on top of Tensor.

    layers   Linear, Embedding, LayerNorm, Conv2d, Dropout: plain objects whose Tensor attributes are their parameters
    optim    Optimizer and SGD, Adam, AdamW: every update lazy, a step realized in one schedule
    state    get_state_dict / load_state_dict (tensors named by their attribute paths), and safe_save / safe_load
             (the safetensors format, read and written with NumPy and json alone)

Everything is importable from here (`from uopc import nn; nn.Linear(...)`); the submodules are where each lives.
"""
from uopc.nn.layers import Linear, Embedding, LayerNorm, Conv2d, Dropout
from uopc.nn.optim import Optimizer, SGD, Adam, AdamW
from uopc.nn.state import get_state_dict, load_state_dict, safe_save, safe_load, SafetensorsError

__all__ = ["Linear", "Embedding", "LayerNorm", "Conv2d", "Dropout", "Optimizer", "SGD", "Adam", "AdamW", "get_state_dict",
           "load_state_dict", "safe_save", "safe_load", "SafetensorsError"]
