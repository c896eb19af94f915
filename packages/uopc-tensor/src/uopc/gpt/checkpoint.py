"""uopc.gpt.checkpoint: a trained GPT as one .safetensors file, and the checks that make a damaged one a one-line error.

A checkpoint is one file the safetensors library reads: the model's tensors, the optimizer's (`optim.*`), and in its
metadata the format, the config, the task and the training history. `load` checks all of it (see there) before it
builds a model, so a damaged file is a CheckpointError that names the file and the fault, never a crash halfway.
"""
from __future__ import annotations
import json, math
from dataclasses import dataclass, asdict, fields as dataclass_fields
from pathlib import Path
import numpy as np
from uopc.tensor import Tensor, TensorError
from uopc import nn
from uopc.gpt.model import GPT, GPTConfig, parameter_shapes
from uopc.gpt.tasks import AdditionTask

FORMAT = "uopc-gpt-1"


class CheckpointError(TensorError):
  """A checkpoint `uopc gpt` can't use; the message names the file and what is wrong with it."""


META_FIELDS = ("config", "task", "step", "lr", "history")       # besides "format", what save writes and load requires
TASK_FIELDS = {"addition": ("task", "digits", "seed", "vocab"), "text": ("task", "data", "seed", "vocab")}   # the tasks' spec()


@dataclass(frozen=True)
class Checkpoint:
  """What load read and checked: the model with its weights, the task spec, the steps trained, the peak learning rate,
  the history ([step, loss, validation loss or None, accuracy or None] a step), and the optimizer's state under AdamW's
  state-dict names (None for a file without one)."""
  path: Path
  model: GPT
  task: dict
  step: int
  lr: float
  history: list
  optimizer: dict | None


def save(path: Path, model: GPT, opt: nn.AdamW, task, step: int, history: list, lr: float) -> None:
  """One .safetensors file: the model's tensors, AdamW's (optim.m.NAME, optim.v.NAME, optim.s1, optim.s2, optim.lr),
  and in the metadata the format, the config, the task's spec, the step, the peak learning rate and the history."""
  state = dict(nn.get_state_dict(model))
  names = list(state)
  for name, p, m, v in zip(names, opt.params, opt.m, opt.v): state[f"optim.m.{name}"], state[f"optim.v.{name}"] = m, v
  state["optim.s1"], state["optim.s2"], state["optim.lr"] = opt._s1, opt._s2, opt._lr
  meta = {"format": FORMAT, "config": json.dumps(asdict(model.cfg)), "task": json.dumps(task.spec()), "step": str(step),
          "lr": repr(lr), "history": json.dumps(history)}
  nn.safe_save(state, path, metadata=meta)


def load(path: Path) -> Checkpoint:
  """The checkpoint file at `path` (see save), checked whole before any of it is used. Each fault is a one-line
  CheckpointError that names the file and the fault (a file that isn't safetensors at all, nn.safe_load's
  SafetensorsError):

    metadata  format, config, task, step, lr and history, each there, JSON and of its type (other keys are ignored: a
              tool may annotate the file); the config has exactly GPTConfig's fields, the task exactly its kind's
              (TASK_FIELDS) and a vocabulary of config.vocab distinct characters (an addition's is AdditionTask's);
    tensors   exactly the model's (parameter_shapes), f32, of their shapes, finite; and the optimizer's either all
              there and in range (optim.m.NAME, optim.v.NAME >= 0, optim.s1 and optim.s2 in [0, 1), optim.lr) or none.

  A file without optimizer state is a checkpoint of the weights alone, not a damaged one (part of the state is
  damage): it samples, and `uopc gpt train --resume` trains on from it with a fresh AdamW and a warning, as a user who
  kept only the weights expects."""
  if not path.is_file(): raise CheckpointError(f"{path}: no checkpoint (expected a model.safetensors written by `uopc gpt train`)")
  tensors, meta = nn.safe_load(path, with_metadata=True)
  def damaged(what: str) -> CheckpointError: return CheckpointError(f"{path}: {what}")
  if meta.get("format") != FORMAT: raise damaged(f"not a uopc GPT checkpoint (its metadata has no format {FORMAT!r})")
  fields = {}
  for key in META_FIELDS:
    if key not in meta: raise damaged(f"its metadata has no {key!r}")
    try: fields[key] = json.loads(meta[key])
    except (ValueError, RecursionError): raise damaged(f"its metadata's {key!r} is not JSON: {meta[key]!r:.60}") from None
  cfg = _checked_config(fields["config"], damaged)
  spec = _checked_task(fields["task"], cfg, damaged)
  step, lr, history = fields["step"], fields["lr"], fields["history"]
  if type(step) is not int or step < 0: raise damaged(f"its step {step!r:.40} is not a whole number >= 0")
  if type(lr) not in (int, float) or not 0 < lr < math.inf: raise damaged(f"its learning rate {lr!r:.40} is not a number above 0")
  _check_history(history, damaged)
  shapes = _checked_model_tensors(tensors, cfg, damaged)
  optimizer = _checked_optimizer_state(tensors, shapes, damaged)
  model = GPT(cfg)
  nn.load_state_dict(model, {name: tensors[name] for name in shapes})
  return Checkpoint(path, model, spec, step, float(lr), history, optimizer)


def _json_kind(v) -> str:
  kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(type(v), "a number")
  return f"{kind} {json.dumps(v)[:40]}" if kind != "an object" else kind


def _checked_config(config, damaged) -> GPTConfig:
  if not isinstance(config, dict): raise damaged(f"its config is {_json_kind(config)}, not an object")
  known = [f.name for f in dataclass_fields(GPTConfig)]
  if missing := [k for k in known if k not in config]: raise damaged(f"its config has no {', '.join(missing)}")
  if extra := sorted(set(config) - set(known)): raise damaged(f"its config has fields GPTConfig doesn't know: {extra[:5]}")
  try: return GPTConfig(**config)
  except TensorError as e: raise damaged(f"its config is damaged: {e}") from None


def _checked_task(spec, cfg: GPTConfig, damaged) -> dict:
  if not isinstance(spec, dict): raise damaged(f"its task is {_json_kind(spec)}, not an object")
  kind = spec.get("task")
  if kind not in TASK_FIELDS: raise damaged(f"its task is {json.dumps(kind)[:40]}, neither \"addition\" nor \"text\"")
  if missing := [k for k in TASK_FIELDS[kind] if k not in spec]: raise damaged(f"its {kind} task has no {', '.join(missing)}")
  if extra := sorted(set(spec) - set(TASK_FIELDS[kind])): raise damaged(f"its {kind} task has fields uopc doesn't know: {extra[:5]}")
  seed, vocab = spec["seed"], spec["vocab"]
  if type(seed) is not int or seed < 0: raise damaged(f"its task's seed {json.dumps(seed)[:40]} is not a whole number >= 0")
  if not isinstance(vocab, str): raise damaged(f"its task's vocabulary is {_json_kind(vocab)}, not a string")
  if len(vocab) != cfg.vocab: raise damaged(f"its task's vocabulary has {len(vocab)} characters, but the model has {cfg.vocab} tokens")
  if len(set(vocab)) != len(vocab): raise damaged(f"its task's vocabulary repeats characters: {vocab!r:.60}")
  if kind == "addition":
    if vocab != AdditionTask.vocab: raise damaged(f"its addition task's vocabulary is {vocab!r:.40}, not {AdditionTask.vocab!r}")
    if type(spec["digits"]) is not int or not 1 <= spec["digits"] <= 6:
      raise damaged(f"its addition task's digits {json.dumps(spec['digits'])[:40]} is not a whole number from 1 to 6")
  elif not isinstance(spec["data"], str) or not spec["data"]:
    raise damaged(f"its text task's data {json.dumps(spec['data'])[:40]} is not a file name")
  return spec


def _check_history(history, damaged) -> None:
  if not isinstance(history, list): raise damaged(f"its history is {_json_kind(history)}, not a list")
  def number(v) -> bool: return type(v) in (int, float) and math.isfinite(v)
  for i, h in enumerate(history):
    if not (isinstance(h, list) and len(h) == 4 and type(h[0]) is int and number(h[1]) and all(v is None or number(v) for v in h[2:])):
      raise damaged(f"its history's entry {i} is {json.dumps(h)[:60]}, not [step, loss, validation loss or null, accuracy or null]")


def _check_tensor(name: str, t: Tensor, shape: tuple, damaged) -> np.ndarray:
  if t.shape != shape: raise damaged(f"tensor {name} has shape {t.shape}, but its config needs {shape}")
  if t.dtype.name != "f32": raise damaged(f"tensor {name} is {t.dtype.name}, not f32")
  values = t.numpy()
  if not np.isfinite(values).all(): raise damaged(f"tensor {name} holds NaN or infinity")
  return values


def _checked_model_tensors(tensors: dict, cfg: GPTConfig, damaged) -> dict:
  """parameter_shapes(cfg), once the file's model tensors are exactly those."""
  held = [k for k in tensors if not k.startswith("optim.")]
  layers_held = len({k.split(".")[1] for k in held if k.startswith("blocks.")})
  if cfg.layers != layers_held:         # before parameter_shapes, which would name the blocks of a layers of 10**9 first
    raise damaged(f"its config has {cfg.layers} layers, but its tensors hold {layers_held}")
  shapes = parameter_shapes(cfg)
  if missing := [k for k in shapes if k not in tensors]: raise damaged(f"the model's tensors {missing[:4]} are missing")
  if extra := [k for k in held if k not in shapes]: raise damaged(f"tensors {extra[:4]} are neither the model's nor the optimizer's")
  for name, shape in shapes.items(): _check_tensor(name, tensors[name], shape, damaged)
  return shapes


def _checked_optimizer_state(tensors: dict, shapes: dict, damaged) -> dict | None:
  """AdamW's state dict from the optim.* tensors (m.i and v.i for the i-th parameter), or None when there are none."""
  held = [k for k in tensors if k.startswith("optim.")]
  if not held: return None
  want = {**{f"optim.m.{n}": s for n, s in shapes.items()}, **{f"optim.v.{n}": s for n, s in shapes.items()},
          "optim.s1": (), "optim.s2": (), "optim.lr": ()}
  if missing := [k for k in want if k not in tensors]:
    raise damaged(f"its optimizer state is partial: {len(missing)} of its {len(want)} tensors are missing, {missing[:3]} first "
                  "(a checkpoint has all of them, or none to resume with a fresh optimizer)")
  if extra := [k for k in held if k not in want]: raise damaged(f"tensors {extra[:4]} are not the optimizer's")
  values = {k: _check_tensor(k, tensors[k], shape, damaged) for k, shape in want.items()}
  for k in ("optim.s1", "optim.s2"):
    if not 0 <= values[k] < 1: raise damaged(f"{k} is {float(values[k])}, outside [0, 1) where 1 - beta**step lies")
  if negative := [n for n in shapes if (values[f"optim.v.{n}"] < 0).any()]:
    raise damaged(f"optim.v.{negative[0]} has negative entries, and it is a running mean of squares")
  return {**{f"m.{i}": tensors[f"optim.m.{n}"] for i, n in enumerate(shapes)}, **{f"v.{i}": tensors[f"optim.v.{n}"] for i, n in enumerate(shapes)},
          "_s1": tensors["optim.s1"], "_s2": tensors["optim.s2"]}
