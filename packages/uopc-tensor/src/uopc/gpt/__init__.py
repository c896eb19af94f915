"""uopc.gpt: the course GPT, a decoder-only transformer built from Tensor ops, its tasks, checkpoints and command.

    model       GPTConfig, GPT (forward, loss, incremental decode), training_step (jitted), generate
    tasks       AdditionTask and TextTask: batches of (inputs, targets); data_rng, a run's random streams
    checkpoint  save and load one .safetensors file (model, optimizer, config, task, history), every fault named
    cli         `uopc gpt train` and `uopc gpt sample` (register is uopc-tensor's uopc.commands entry point)
    plot        the loss plot saved beside a checkpoint

Everything is importable from here (`from uopc.gpt import GPT, GPTConfig`); the submodules are where each lives.
"""
from uopc.gpt.model import GPTConfig, Block, GPT, training_step, parameter_shapes, parameter_count, generate
from uopc.gpt.tasks import AdditionTask, TextTask, data_rng, TRAIN_STREAM, VAL_STREAM
from uopc.gpt.checkpoint import FORMAT, META_FIELDS, TASK_FIELDS, CheckpointError, Checkpoint, save, load
from uopc.gpt.cli import learning_rate, cmd_train, cmd_sample, register

__all__ = ["GPTConfig", "Block", "GPT", "training_step", "parameter_shapes", "parameter_count", "generate", "AdditionTask", "TextTask",
           "data_rng", "TRAIN_STREAM", "VAL_STREAM", "FORMAT", "META_FIELDS", "TASK_FIELDS", "CheckpointError", "Checkpoint", "save",
           "load", "learning_rate", "cmd_train", "cmd_sample", "register"]
