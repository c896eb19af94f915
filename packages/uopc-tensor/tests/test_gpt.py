"""uopc.gpt: the model (names, size, causality, incremental decoding against the full forward pass), the addition task,
and the `uopc gpt` command on tiny configs: train, sample, resume, text data, and one-line errors for bad input."""
import json
import math
import numpy as np
import pytest
from uopc.cli import main
from uopc.tensor import Tensor, TensorError
from uopc import nn
from uopc.gpt import (GPT, GPTConfig, AdditionTask, TextTask, generate, parameter_count, parameter_shapes, learning_rate, save, load,
                      CheckpointError, TASK_FIELDS, data_rng, training_step, TRAIN_STREAM)
from uopc.gpt.model import recent_block
from hostile import raises_one_line

TINY = ["--width", "16", "--heads", "2", "--layers", "1", "--batch", "4"]


def tiny_model(**kw) -> GPT:
  Tensor.manual_seed(0)
  return GPT(GPTConfig(**{"vocab": 13, "context": 8, "layers": 2, "width": 16, "heads": 2, **kw}))


def test_the_benchmark_config_has_the_parameter_count_of_the_issue():
  cfg = GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4)
  assert parameter_count(cfg) == 421_632
  assert sum(p.numel() for p in GPT(cfg).parameters()) == 421_632
  tied = GPTConfig(vocab=65, context=64, layers=2, width=128, heads=4, tied_head=True)
  assert sum(p.numel() for p in GPT(tied).parameters()) == parameter_count(tied) == 421_632 - 65 * 128


def test_state_dict_names_are_stable():
  names = set(nn.get_state_dict(tiny_model(layers=1)))
  block = {f"blocks.0.{m}.{p}" for m in ("ln1", "ln2", "attn", "proj", "fc", "out") for p in ("weight", "bias")}
  assert names == {"wte.weight", "wpe.weight", "lnf.weight", "lnf.bias", "head.weight"} | block


@pytest.mark.parametrize("tied", [False, True])
def test_parameter_shapes_from_the_config_are_the_models(tied):
  cfg = GPTConfig(vocab=13, context=8, layers=2, width=16, heads=2, tied_head=tied)
  assert list(parameter_shapes(cfg).items()) == [(k, t.shape) for k, t in nn.get_state_dict(GPT(cfg)).items()]


@pytest.mark.parametrize("bad, message", [
  (dict(width=30, heads=4), "width 30 is not divisible by heads 4"),
  (dict(layers=0), "layers must be a positive integer"),
  (dict(vocab=2.5), "vocab must be a positive integer"),
  (dict(dropout=1.0), r"dropout must be a number in \[0, 1\)"),
  (dict(dropout="0.1"), r"dropout must be a number in \[0, 1\), got '0.1'"),
  (dict(tied_head="no"), "tied_head must be True or False, got 'no'"),
])
def test_bad_configs_are_refused(bad, message):
  with pytest.raises(TensorError, match=message): GPTConfig(**{"vocab": 13, **bad})


def test_the_model_is_causal():
  model = tiny_model()
  x = np.random.default_rng(0).integers(0, 13, (2, 8)).astype(np.int32)
  y = x.copy()
  y[:, 5:] = (y[:, 5:] + 1) % 13
  a, b = model(Tensor(x)).numpy(), model(Tensor(y)).numpy()
  assert a.shape == (2, 8, 13)
  np.testing.assert_array_equal(a[:, :5], b[:, :5])
  assert np.abs(a[:, 5:] - b[:, 5:]).max() > 1e-4


@pytest.mark.parametrize("tied", [False, True])
def test_incremental_decoding_matches_the_full_forward_pass(tied):
  # positions 0 and 1 run and capture the decode jit; every later one is a replay that must see the cache grow
  model = tiny_model(tied_head=tied)
  x = np.random.default_rng(1).integers(0, 13, (3, 8)).astype(np.int32)
  full = model(Tensor(x)).numpy()
  for pos in range(8): np.testing.assert_allclose(model.decode(x[:, pos], pos), full[:, pos], rtol=1e-4, atol=1e-5)
  # a second sequence through the same caches starts over at position 0
  x2 = x[::-1].copy()
  full2 = model(Tensor(x2)).numpy()
  for pos in range(4): np.testing.assert_allclose(model.decode(x2[:, pos], pos), full2[:, pos], rtol=1e-4, atol=1e-5)


def test_decoding_across_the_recent_blocks_matches_the_full_forward_pass():
  # context 8 (the other decoding tests' model: nothing new to compile): recent blocks of 2 positions, written into the
  # full cache at positions 2, 4 and 6; sequences start over at 0 after stopping inside a block and after a whole
  # context: stale keys stay masked
  assert recent_block(12) == 3 and recent_block(64) == 8 and recent_block(256) == 16 and recent_block(7) == 1
  model = tiny_model()
  rng = np.random.default_rng(2)
  for length in (8, 3, 8, 5):
    x = rng.integers(0, 13, (3, 8)).astype(np.int32)      # 3 sequences, as the test above: its kernels
    full = model(Tensor(x)).numpy()          # causal: position p's logits see tokens up to p only (one shape to compile)
    for pos in range(length): np.testing.assert_allclose(model.decode(x[:, pos], pos), full[:, pos], rtol=1e-4, atol=1e-5)


def test_greedy_generation_follows_the_argmax_of_the_full_forward_pass():
  model = tiny_model()
  prompt = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
  out = generate(model, prompt, 4, temperature=0.0)
  seq = prompt
  for _ in range(4):
    nxt = model(Tensor(seq)).numpy()[:, -1].argmax(-1)
    seq = np.concatenate([seq, nxt[:, None].astype(np.int32)], 1)
  np.testing.assert_array_equal(out, seq[:, 3:])


@pytest.mark.parametrize("prompt_length", [3, 11])
def test_generation_past_the_context_conditions_on_the_last_context_tokens(prompt_length):
  # the oracle is nanoGPT's loop: a plain forward pass of the last `context` (8) tokens, no cache; greedy, and top-k 1.
  # Embeddings N(0, 1), not GPT-2's N(0, 0.02): with those a tiny random model repeats one token whatever it is given.
  model = tiny_model()
  for e in (model.wte, model.wpe): e.weight.assign(e.weight * 50).realize()
  prompt = np.random.default_rng(2).integers(0, 13, (2, prompt_length)).astype(np.int32)
  out = generate(model, prompt, 14, temperature=0.0)
  seq = prompt
  for _ in range(14):
    nxt = model(Tensor(seq[:, -8:])).numpy()[:, -1].argmax(-1)
    seq = np.concatenate([seq, nxt[:, None].astype(np.int32)], 1)
  assert out.shape == (2, 14) and len(np.unique(out[:, -6:])) > 2        # past the context, and not one token repeated
  np.testing.assert_array_equal(out, seq[:, prompt_length:])
  np.testing.assert_array_equal(generate(model, prompt, 14, temperature=1.0, top_k=1), out)


def test_the_decode_caches_are_not_parameters():
  model = tiny_model()
  model.decode(np.zeros(2, np.int32), 0)
  assert not any("decoder" in k for k in nn.get_state_dict(model))


def test_addition_examples_predict_only_the_answer_and_hold_out_a_tenth():
  task = AdditionTask(2, seed=0)
  x, y = task.batch(np.random.default_rng(0), 64)
  assert x.shape == y.shape == (64, task.length - 1)
  for row_x, row_y in zip(x, y):
    text = "".join(task.vocab[t] for t in row_x)
    a, rest = text.split("+", 1)
    b = rest.split("=", 1)[0]
    answer = f"{int(a) + int(b)}\n"
    assert text.startswith(f"{a}+{b}={answer.strip()}")
    predicted = "".join(task.vocab[t] for t in row_y if t != -100)
    assert predicted == answer
  assert len(task.heldout) == 1000
  held = set(map(tuple, task.heldout.tolist()))
  assert not held & set(map(tuple, task._train.tolist())) and len(held) + len(task._train) == 10_000
  short = np.mean([min(len(str(a)), len(str(b))) == 1 for a, b in task._train[np.random.default_rng(0).choice(
    len(task._train), 4000, p=task._weights)].tolist()])
  assert 0.6 < short < 0.9            # operand lengths are drawn uniformly: P(some operand has one digit) = 3/4


def test_the_schedule_warms_up_then_decays_to_a_tenth():
  lrs = [learning_rate(1.0, s, 1000) for s in range(1000)]
  assert lrs[0] == 1 / 50 and lrs[49] == 1.0 and max(lrs) == 1.0
  assert all(a >= b for a, b in zip(lrs[49:], lrs[50:])) and math.isclose(lrs[-1], 0.1, rel_tol=1e-3)


def test_text_task_splits_and_checks_its_file(tmp_path):
  f = tmp_path / "t.txt"
  f.write_text("hello world, " * 20, encoding="utf-8")
  task = TextTask(str(f), context=8)
  assert task.vocab == "".join(sorted(set("hello world, ")))
  x, y = task.batch(np.random.default_rng(0), 5, "val")
  assert x.shape == (5, 8) and (x[:, 1:] == y[:, :-1]).all()
  f.write_text("abc", encoding="utf-8")
  with pytest.raises(TensorError, match="too few for a context of 8"): TextTask(str(f), context=8)
  f.write_bytes(b"\xff\xfe\x00")
  with pytest.raises(TensorError, match="not UTF-8"): TextTask(str(f), context=8)


# ---- the command ----------------------------------------------------------------------------------------------------

def run(capsys, *argv) -> tuple[int, str, str]:
  status = main(["gpt", *argv])
  out, err = capsys.readouterr()
  return status, out, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny addition run: 6 steps, written to a directory the tests below read (and resume from a copy of)."""
  out = tmp_path_factory.mktemp("gpt") / "run"
  assert main(["gpt", "train", "--steps", "6", *TINY, "--out", str(out)]) == 0
  return out


@pytest.mark.training_run
def test_train_writes_a_checkpoint_the_safetensors_library_reads_and_a_plot(trained):
  from safetensors.numpy import load_file          # the library itself (the tensor session installs it)
  tensors = load_file(str(trained / "model.safetensors"))
  model = load(trained / "model.safetensors").model
  for name, t in nn.get_state_dict(model).items(): np.testing.assert_array_equal(tensors[name], t.numpy())
  assert {k for k in tensors if k.startswith("optim.m.")} == {f"optim.m.{k}" for k in nn.get_state_dict(model)}


@pytest.mark.training_run
def test_train_reports_and_saves_what_it_did(trained):
  ckpt = load(trained / "model.safetensors")
  assert ckpt.model.cfg == GPTConfig(vocab=13, context=16, layers=1, width=16, heads=2)
  assert ckpt.task["task"] == "addition" and ckpt.step == 6 and ckpt.optimizer is not None
  assert [h[0] for h in ckpt.history] == list(range(1, 7)) and ckpt.history[-1][3] is not None
  assert (trained / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.training_run
def test_the_last_line_gives_the_final_loss_and_accuracy(capsys, tmp_path):
  status, out, err = run(capsys, "train", "--steps", "2", *TINY, "--out", str(tmp_path))
  assert status == 0
  last = out.strip().splitlines()[-1]
  assert last.startswith("final loss ") and "accuracy" in last and "held-out additions of numbers below 100" in last


@pytest.mark.training_run
def test_sample_answers_an_addition_prompt(capsys, trained):
  status, out, _ = run(capsys, "sample", str(trained), "--prompt", "12+34=")
  assert status == 0
  line = out.strip()
  assert line.startswith("12+34=") and set(line[6:]) <= set("0123456789+=")
  status, out2, _ = run(capsys, "sample", str(trained), "--prompt", "12+34=", "--temperature", "1.5", "--top-k", "3", "--seed", "4")
  assert status == 0 and out2.startswith("12+34=")


@pytest.mark.training_run
def test_resume_continues_the_step_count_and_the_optimizer_state(capsys, trained, tmp_path):
  import shutil
  run_dir = tmp_path / "resumed"
  shutil.copytree(trained, run_dir)
  before = nn.safe_load(run_dir / "model.safetensors")
  status, _, err = run(capsys, "train", "--resume", str(run_dir), "--steps", "3")
  assert status == 0 and "warning" not in err
  after, ckpt = nn.safe_load(run_dir / "model.safetensors"), load(run_dir / "model.safetensors")
  assert ckpt.step == 9 and len(ckpt.history) == 9
  # Adam's bias corrections carried on from step 6: 1 - beta1^9, not 1 - beta1^3
  np.testing.assert_allclose(after["optim.s1"].numpy(), 1 - 0.9 ** 9, rtol=1e-5)
  assert not np.array_equal(after["optim.m.head.weight"].numpy(), before["optim.m.head.weight"].numpy())


@pytest.mark.training_run
def test_train_on_a_text_file_then_sample_it(capsys, tmp_path):
  data = tmp_path / "poem.txt"
  data.write_text("the cat sat on the mat. " * 40, encoding="utf-8")
  out = tmp_path / "text"
  status, stdout, _ = run(capsys, "train", "--data", str(data), "--steps", "3", "--context", "16", *TINY, "--out", str(out))
  assert status == 0 and "validation loss" in stdout.strip().splitlines()[-1]
  status, stdout, _ = run(capsys, "sample", str(out), "--prompt", "the ", "--tokens", "5")
  assert status == 0 and stdout.startswith("the ") and len(stdout.rstrip("\n")) <= 9
  # past the context of 16, from a short prompt and from one longer than the context: every token asked for
  for prompt in ("the ", "the cat sat on the mat. "):
    status, stdout, _ = run(capsys, "sample", str(out), "--prompt", prompt, "--tokens", "40")
    assert status == 0 and stdout.startswith(prompt) and len(stdout.rstrip("\n")) == len(prompt) + 40


@pytest.mark.parametrize("argv, message", [
  (["train", "--data", "{tmp}/missing.txt"], "--data {tmp}/missing.txt: no such file"),
  (["train", "--data", "{tmp}/empty.txt"], "the file is empty"),
  (["train", "--width", "30", "--heads", "4"], "width 30 is not divisible by heads 4"),
  (["train", "--resume", "{tmp}/nowhere"], "no checkpoint"),
  (["train", "--context", "4"], "--context 4 is shorter than an example"),
  (["train", "--data", "{tmp}/empty.txt", "--digits", "3"], "--digits 3 is for the addition task, not for --data {tmp}/empty.txt"),
  (["sample", "{tmp}/nowhere", "--prompt", "1+1="], "no checkpoint"),
])
def test_bad_input_is_a_one_line_error(capsys, tmp_path, argv, message):
  (tmp_path / "empty.txt").write_text("")
  status, out, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
  assert status == 1 and err.count("\n") == 1 and err.startswith("uopc: error: ") and message.format(tmp=tmp_path) in err


@pytest.mark.parametrize("argv, message", [
  (["train", "--steps", "-5"], "--steps must be at least 1, got -5"),
  (["train", "--lr", "-1"], "--lr must be above 0"),
  (["sample", "x", "--temperature", "-1"], "--temperature must be at least 0"),
  (["train", "--seed", "-1"], "--seed must be at least 0, got -1"),
  (["sample", "x", "--seed", "-3"], "--seed must be at least 0, got -3"),
])
def test_bad_numbers_are_usage_errors(capsys, argv, message):
  with pytest.raises(SystemExit) as e: main(["gpt", *argv])
  assert e.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.training_run
def test_checkpoints_of_another_shape_and_prompts_outside_the_vocabulary_are_refused(capsys, trained):
  status, _, err = run(capsys, "train", "--resume", str(trained), "--width", "32")
  assert status == 1 and "the checkpoint has width 16, but --width 32 was given" in err
  for option in (["--digits", "3"], ["--data", "poem.txt"]):      # a resumed run keeps its task
    status, _, err = run(capsys, "train", "--resume", str(trained), *option)
    assert status == 1 and f"the checkpoint learns additions of 2-digit numbers, but {' '.join(option)} was given" in err
  status, _, err = run(capsys, "sample", str(trained), "--prompt", "12*3=")
  assert status == 1 and "characters the model never saw: '*'" in err
  bad = trained.parent / "bad"
  bad.mkdir(exist_ok=True)
  nn.safe_save({"x": Tensor(np.zeros(3, np.float32))}, bad / "model.safetensors")
  status, _, err = run(capsys, "sample", str(bad))
  assert status == 1 and "not a uopc GPT checkpoint" in err


@pytest.mark.training_run
def test_a_diverging_run_stops_with_an_error(capsys, tmp_path):
  status, _, err = run(capsys, "train", "--steps", "20", *TINY, "--lr", "1e9", "--out", str(tmp_path))
  assert status == 1 and "the run diverged" in err


# ---- the data streams -------------------------------------------------------------------------------------------------

def _pairs(task: AdditionTask, x: np.ndarray) -> list[tuple[int, int]]:
  texts = ["".join(task.vocab[t] for t in row).split("=")[0] for row in x]
  return [tuple(map(int, t.split("+"))) for t in texts]


@pytest.mark.parametrize("digits", [3, 4, 5, 6])
def test_training_batches_are_whole_and_disjoint_from_the_held_out_problems(digits):
  task = AdditionTask(digits, seed=0)
  held = set(map(tuple, task.heldout.tolist()))
  assert len(held) == len(task.heldout) == 2000
  # the run's training stream, and the held-out draw's own stream (the old training stream at step 0): whole batches of
  # training problems from both
  for rng in (data_rng(0, TRAIN_STREAM, 0), np.random.default_rng(0)):
    x, y = task.batch(rng, 64)
    assert ((y != -100).sum(1) >= 2).all()            # every row predicts an answer and its newline
    pairs = _pairs(task, x)
    assert len(pairs) == 64 and not held & set(pairs)
  assert set(_pairs(task, task.batch(np.random.default_rng(1), 64, "val")[0])) <= held


@pytest.mark.parametrize("digits", [3, 4, 5, 6])
def test_a_few_training_steps_give_finite_losses_for_every_digit_count(digits):
  # every batch is padded as the task pads its short examples, to the 6-digit length: one shape, so one compile for all
  width = AdditionTask(6).length - 1
  task = AdditionTask(digits, seed=0)
  Tensor.manual_seed(0)
  model = GPT(GPTConfig(vocab=len(task.vocab), context=width, layers=1, width=16, heads=2))
  step = training_step(model, nn.AdamW(model.parameters(), lr=1e-3))
  rng = data_rng(0, TRAIN_STREAM, 0)
  losses = []
  for _ in range(3):
    x, y = task.batch(rng, 4)
    pad = ((0, 0), (0, width - x.shape[1]))
    x, y = np.pad(x, pad, constant_values=task.vocab.index("\n")), np.pad(y, pad, constant_values=-100)
    losses.append(float(step(Tensor(x), Tensor(y)).item()))
  assert all(math.isfinite(v) and v > 0 for v in losses), losses


@pytest.mark.training_run
def test_the_command_trains_three_digit_additions(capsys, tmp_path):
  status, out, err = run(capsys, "train", "--digits", "3", "--steps", "2", *TINY, "--out", str(tmp_path))
  assert status == 0, err
  assert "held-out additions of numbers below 1000" in out.strip().splitlines()[-1]
  assert all(math.isfinite(h[1]) for h in load(tmp_path / "model.safetensors").history)


@pytest.mark.training_run
def test_a_batch_with_nothing_to_predict_is_its_own_error_not_a_nan(capsys, tmp_path, monkeypatch):
  real = AdditionTask.batch
  def nothing_to_predict(self, rng, size, split="train"):
    x, y = real(self, rng, size, split)
    return x, (np.full_like(y, -100) if split == "train" else y)
  monkeypatch.setattr(AdditionTask, "batch", nothing_to_predict)
  status, _, err = run(capsys, "train", "--steps", "2", *TINY, "--out", str(tmp_path))
  assert status == 1 and "the training batch of step 1 has no token to predict" in err and "nan" not in err


# ---- damaged checkpoints: each is a one-line CheckpointError naming the file and the fault ---------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  """What save writes for a tiny untrained model (the catalogue damages copies of it; no training needed)."""
  path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
  model = tiny_model(layers=1)
  history = [[1, 2.5, None, None], [2, 2.4, 2.6, 0.0], [3, 2.3, None, None]]
  save(path, model, nn.AdamW(model.parameters(), lr=1e-3), AdditionTask(2), 3, history, 1e-3)
  return path


def meta_is(key, value): return lambda state, meta: meta.__setitem__(key, value)
def meta_without(key): return lambda state, meta: meta.pop(key)
def tensor_is(name, values): return lambda state, meta: state.__setitem__(name, Tensor(np.asarray(values)))
def tensor_without(name): return lambda state, meta: state.pop(name)


def field_is(key, field, value, drop=False):
  """Sets (or drops) one field of the JSON object stored under the metadata's `key`."""
  def damage(state, meta):
    obj = json.loads(meta[key])
    if drop: obj.pop(field)
    else: obj[field] = value
    meta[key] = json.dumps(obj)
  return damage


HOSTILE_CHECKPOINTS = {
  "no config": (meta_without("config"), "its metadata has no 'config'"),
  "no task": (meta_without("task"), "its metadata has no 'task'"),
  "no step": (meta_without("step"), "its metadata has no 'step'"),
  "no lr": (meta_without("lr"), "its metadata has no 'lr'"),
  "no history": (meta_without("history"), "its metadata has no 'history'"),
  "config not JSON": (meta_is("config", '{"vocab": 13'), "its metadata's 'config' is not JSON"),
  "config nested too deep": (meta_is("config", "[" * 100_000), "its metadata's 'config' is not JSON"),
  "config a list": (meta_is("config", "[13, 8]"), "its config is a list [13, 8], not an object"),
  "config without width": (field_is("config", "width", None, drop=True), "its config has no width"),
  "config unknown field": (field_is("config", "rotary", True), "its config has fields GPTConfig doesn't know: ['rotary']"),
  "config width a string": (field_is("config", "width", "16"), "GPTConfig.width must be a positive integer, got '16'"),
  "config dropout a string": (field_is("config", "dropout", "0"), "GPTConfig.dropout must be a number in [0, 1), got '0'"),
  "config tied_head a string": (field_is("config", "tied_head", "no"), "GPTConfig.tied_head must be True or False"),
  "config heads 3": (field_is("config", "heads", 3), "width 16 is not divisible by heads 3"),
  "config width 10**9": (field_is("config", "width", 10**9), "tensor wte.weight has shape (13, 16), but its config needs (13, 1000000000)"),
  "config layers 2": (field_is("config", "layers", 2), "its config has 2 layers, but its tensors hold 1"),
  "config layers 10**9": (field_is("config", "layers", 10**9), "its config has 1000000000 layers, but its tensors hold 1"),
  "config tied, head kept": (field_is("config", "tied_head", True), "tensors ['head.weight'] are neither the model's nor the optimizer's"),
  "task a number": (meta_is("task", "5"), "its task is a number 5, not an object"),
  "task unknown": (field_is("task", "task", "poetry"), 'its task is "poetry", neither "addition" nor "text"'),
  "task without vocab": (field_is("task", "vocab", None, drop=True), "its addition task has no vocab"),
  "task unknown field": (field_is("task", "base", 16), "its addition task has fields uopc doesn't know: ['base']"),
  "task text without data": (field_is("task", "task", "text"), "its text task has no data"),
  "vocab short": (field_is("task", "vocab", "0123456789"), "its task's vocabulary has 10 characters, but the model has 13 tokens"),
  "vocab a number": (field_is("task", "vocab", 13), "its task's vocabulary is a number 13, not a string"),
  "vocab repeats": (field_is("task", "vocab", "0123456789+=="), "its task's vocabulary repeats characters"),
  "vocab not addition's": (field_is("task", "vocab", "abcdefghijklm"), "its addition task's vocabulary is 'abcdefghijklm'"),
  "digits 9": (field_is("task", "digits", 9), "its addition task's digits 9 is not a whole number from 1 to 6"),
  "digits a string": (field_is("task", "digits", "2"), 'its addition task\'s digits "2" is not a whole number'),
  "seed negative": (field_is("task", "seed", -1), "its task's seed -1 is not a whole number >= 0"),
  "step not JSON": (meta_is("step", "six"), "its metadata's 'step' is not JSON: 'six'"),
  "step negative": (meta_is("step", "-1"), "its step -1 is not a whole number >= 0"),
  "step fractional": (meta_is("step", "1.5"), "its step 1.5 is not a whole number >= 0"),
  "lr zero": (meta_is("lr", "0"), "its learning rate 0 is not a number above 0"),
  "lr a string": (meta_is("lr", '"fast"'), "its learning rate 'fast' is not a number above 0"),
  "history an object": (meta_is("history", "{}"), "its history is an object, not a list"),
  "history entry short": (meta_is("history", "[[1]]"), "its history's entry 0 is [1], not [step, loss,"),
  "history loss a string": (meta_is("history", '[[1, "low", null, null]]'), "its history's entry 0 is"),
  "head missing": (tensor_without("head.weight"), "the model's tensors ['head.weight'] are missing"),
  "tensor unknown": (tensor_is("junk", np.zeros(2, np.float32)), "tensors ['junk'] are neither the model's nor the optimizer's"),
  "tensor wrong shape": (tensor_is("wte.weight", np.zeros((13, 8), np.float32)),
                         "tensor wte.weight has shape (13, 8), but its config needs (13, 16)"),
  "tensor i32": (tensor_is("lnf.bias", np.zeros(16, np.int32)), "tensor lnf.bias is i32, not f32"),
  "tensor NaN": (tensor_is("lnf.bias", np.full(16, np.nan, np.float32)), "tensor lnf.bias holds NaN or infinity"),
  "optimizer partial": (tensor_without("optim.m.wte.weight"),
                        "its optimizer state is partial: 1 of its 37 tensors are missing, ['optim.m.wte.weight']"),
  "optimizer wrong shape": (tensor_is("optim.v.lnf.bias", np.zeros(3, np.float32)),
                            "tensor optim.v.lnf.bias has shape (3,), but its config needs (16,)"),
  "optimizer unknown": (tensor_is("optim.momentum", np.zeros(1, np.float32)), "tensors ['optim.momentum'] are not the optimizer's"),
  "optimizer s1 past 1": (tensor_is("optim.s1", np.float32(1.5)), "optim.s1 is 1.5, outside [0, 1)"),
  "optimizer v negative": (tensor_is("optim.v.lnf.bias", np.full(16, -1, np.float32)), "optim.v.lnf.bias has negative entries"),
}


def _damaged(src, directory, damage):
  state, meta = nn.safe_load(src, with_metadata=True)
  damage(state, meta)
  path = directory / "model.safetensors"
  nn.safe_save(state, path, metadata=meta)
  return path


def test_the_undamaged_checkpoint_loads(checkpoint):
  ckpt = load(checkpoint)
  assert ckpt.step == 3 and ckpt.lr == 1e-3 and ckpt.history[1] == [2, 2.4, 2.6, 0.0] and ckpt.task == AdditionTask(2).spec()
  adamw = nn.get_state_dict(nn.AdamW(ckpt.model.parameters()))
  assert set(ckpt.optimizer) == {k for k in adamw if k[:2] in ("m.", "v.")} | {"_s1", "_s2"}
  for name, t in ckpt.optimizer.items(): assert t.shape == adamw[name].shape


def test_the_task_fields_are_those_the_tasks_write(tmp_path):
  (tmp_path / "t.txt").write_text("hello world, " * 20, encoding="utf-8")
  assert tuple(AdditionTask(2).spec()) == TASK_FIELDS["addition"]
  assert tuple(TextTask(str(tmp_path / "t.txt"), 8).spec()) == TASK_FIELDS["text"]


@pytest.mark.parametrize("case", list(HOSTILE_CHECKPOINTS))
def test_a_damaged_checkpoint_is_a_one_line_error_naming_the_file(capsys, checkpoint, tmp_path, case):
  damage, message = HOSTILE_CHECKPOINTS[case]
  path = _damaged(checkpoint, tmp_path, damage)
  assert raises_one_line(lambda: load(path), CheckpointError, message).startswith(f"{path}: ")
  for argv in (["sample", str(tmp_path)], ["train", "--resume", str(tmp_path), "--steps", "1"]):
    status, _, err = run(capsys, *argv)
    assert status == 1 and err.count("\n") == 1 and err.startswith(f"uopc: error: {path}: ") and message in err, err


@pytest.mark.training_run
def test_resume_without_optimizer_state_trains_on_with_a_fresh_optimizer_and_a_warning(capsys, trained, tmp_path):
  def weights_only(state, meta):
    for name in [k for k in state if k.startswith("optim.")]: state.pop(name)
  path = _damaged(trained / "model.safetensors", tmp_path, weights_only)
  assert load(path).optimizer is None
  status, out, _ = run(capsys, "sample", str(tmp_path), "--prompt", "12+34=")
  assert status == 0 and out.startswith("12+34=")
  status, _, err = run(capsys, "train", "--resume", str(tmp_path), "--steps", "3")
  assert status == 0 and f"uopc: warning: {path} has no optimizer state: AdamW starts afresh" in err
  ckpt = load(path)
  assert ckpt.step == 9 and len(ckpt.history) == 9
  np.testing.assert_allclose(nn.safe_load(path)["optim.s1"].numpy(), 1 - 0.9 ** 3, rtol=1e-5)     # three steps of a new AdamW


def test_a_decode_step_reads_the_filled_prefix_of_the_cache(monkeypatch):
  # a long context's step reads the big cache only up to a quarter-of-the-context bucket of what is written (a jitted
  # step per bucket); the tiny model's context 8 takes that road here: blocks of 2, buckets of 2 positions
  from uopc.gpt import model as gpt_model
  monkeypatch.setattr(gpt_model, "PREFIX_BUCKETS_FROM", 0)
  assert [gpt_model.cache_prefix(8, 2, p) for p in range(8)] == [2, 2, 2, 2, 4, 4, 6, 6]
  assert [gpt_model.cache_prefix(256, 16, p) for p in (0, 63, 64, 79, 80, 128, 143, 144, 255)] == [64, 64, 64, 64, 128, 128, 128, 192, 256]
  model = tiny_model()
  x = np.random.default_rng(5).integers(0, 13, (3, 8)).astype(np.int32)
  full = model(Tensor(x)).numpy()
  for length in (8, 5):
    for pos in range(length): np.testing.assert_allclose(model.decode(x[:, pos], pos), full[:, pos], rtol=1e-4, atol=1e-5)
  [(_, steps, _)] = model._decoders.by_batch.values()
  assert sorted(steps) == [2, 4, 6]                 # (the last position, 7, reads 3 full blocks)
