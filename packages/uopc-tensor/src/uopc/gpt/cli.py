"""uopc.gpt.cli: the `uopc gpt` command (train, sample), registered through uopc-tensor's uopc.commands entry point.

    uopc gpt train [--task addition | --data FILE] ...      train, save DIR/model.safetensors and DIR/loss.png
    uopc gpt sample DIR --prompt "12+34="                    continue a prompt with a trained model

`register` adds the subcommands to uopc's parser; `cmd_train` runs the jitted training step under the learning rate
schedule, evaluates as it goes and saves a checkpoint and a plot; `cmd_sample` continues a prompt from a checkpoint.
"""
from __future__ import annotations
import argparse, collections, math, os, re, signal, sys, tempfile, threading, time
from pathlib import Path
import numpy as np
from uopc.tensor import Tensor, TensorError
from uopc.jit import jit
from uopc import nn, distributed
from uopc.gpt.model import GPT, GPTConfig, training_step, generate
from uopc.gpt.tasks import AdditionTask, TextTask, data_rng, TRAIN_STREAM, VAL_STREAM
from uopc.gpt.checkpoint import CheckpointError, save, load
from uopc.gpt.plot import plot_history


def _whole(name: str, low: int = 1):
  def parse(v: str) -> int:
    try: n = int(v)
    except ValueError: raise argparse.ArgumentTypeError(f"{name} takes a whole number, got {v!r}") from None
    if n < low: raise argparse.ArgumentTypeError(f"{name} must be at least {low}, got {n}")
    return n
  return parse


def learning_rate(peak: float, step: int, total: int) -> float:
  """The schedule: a linear warmup over the first 5% of the steps (at most 100), then a cosine decay to a tenth."""
  warm = max(1, min(100, total // 20))
  if step < warm: return peak * (step + 1) / warm
  t = (step - warm) / max(1, total - warm)
  return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * t)))


def _number(name: str, low: float, inclusive: bool):
  def parse(v: str) -> float:
    try: x = float(v)
    except ValueError: raise argparse.ArgumentTypeError(f"{name} takes a number, got {v!r}") from None
    if not math.isfinite(x) or x < low or (x == low and not inclusive):
      raise argparse.ArgumentTypeError(f"{name} must be {'at least' if inclusive else 'above'} {low:g}, got {v}")
    return x
  return parse


def cmd_train(args) -> int:
  """`uopc gpt train`. Under MPI (`mpiexec -n N`, or --nproc N, which runs mpiexec) every rank trains on its shard of
  each batch and rank 0 alone reports and writes; an error on any rank stops them all (uopc.distributed.fail)."""
  if args.nproc is not None and args.nproc > 1 and distributed.world_size() == 1: return _launch(args)
  rank, world = distributed.init()
  if world == 1: return _train(args, 0, 1)
  # mpiexec stops the other ranks with a signal when one fails: they go quietly (the failed one said why)
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, lambda *_: os._exit(1))
  wrong = None
  if args.nproc not in (None, world): wrong = f"--nproc {args.nproc}, but mpiexec started {world} processes: give one or the other"
  elif args.batch % world:
    wrong = f"--batch {args.batch} does not split across {world} processes: give a multiple of {world} (it is the global batch)"
  if wrong is not None:          # every rank finds it: rank 0 says it, as a single process would
    if rank == 0: raise TensorError(wrong)
    return 1
  try: return _train(args, rank, world)
  except BaseException as e:     # every other rank waits in its next allreduce: stop them all, naming this rank
    distributed.fail(e)
    raise


def _launch(args) -> int:
  """--nproc N in a single process: run this same command under `mpiexec -n N` (each rank one thread of the
  machine's, unless OMP_NUM_THREADS says otherwise) and return its exit status."""
  import shutil, subprocess
  try: import mpi4py  # noqa: F401
  except ImportError:
    raise TensorError(f"--nproc {args.nproc} runs mpiexec, which needs mpi4py: "
                      "pip install 'uopc-tensor[dist]' (mpi4py and the mpich wheel)") from None
  mpiexec = shutil.which("mpiexec", path=os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
  if mpiexec is None: raise TensorError(f"--nproc {args.nproc}: no mpiexec on PATH or beside {sys.executable} (the mpich wheel installs one)")
  argv = []
  for action in _TRAIN_ACTIONS:
    v = getattr(args, action.dest, None)
    if action.dest == "nproc" or v is None or v == action.default: continue
    argv += [action.option_strings[-1], str(v)]
  env = dict(os.environ)
  env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
  # a rank killed outright can't say so, and mpiexec names a pid only: each rank notes its pid (uopc.distributed.init),
  # a thread here watches which of them is gone first, and mpiexec's report (on stdout) is read on the way through
  with tempfile.TemporaryDirectory(prefix="uopc-ranks-") as pids:
    env["UOPC_DIST_PIDS"] = pids
    proc = subprocess.Popen([mpiexec, "-n", str(args.nproc), sys.executable, "-m", "uopc.cli", "gpt", "train", *argv], env=env,
                            stdout=subprocess.PIPE)
    first_gone: list[set[str]] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_ranks, args=(pids, args.nproc, first_gone, stop), daemon=True)
    watcher.start()
    tail: collections.deque = collections.deque(maxlen=40)
    try:
      for line in proc.stdout:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        tail.append(line)
      status = proc.wait()
    finally:
      stop.set()
      watcher.join()
    report = b"".join(tail).decode(errors="replace")
    if status and (m := re.search(r"BAD TERMINATION.*?PID (\d+).*?EXIT CODE: (\d+)", report, re.S)):
      ranks = _rank_pids(pids)
      # mpiexec names the first process it finds ended, which may be one it stopped itself (SIGKILL, as the failed one)
      # when it stopped them before reporting: the rank seen gone alone, before the others, is the one that failed
      rank = next(iter(first_gone[0])) if first_gone and len(first_gone[0]) == 1 else {p: r for r, p in ranks.items()}.get(m[1])
      if rank is not None:     # mpiexec's exit code is this rank's only when it reported this rank's pid
        how = f"with exit code {m[2]}" if ranks.get(rank) == m[1] else "first"
        print(f"uopc: error: rank {rank} of {args.nproc} (pid {ranks.get(rank)}) ended {how} (killed, or crashed); "
              "mpiexec stopped the other ranks", file=sys.stderr)
  return status


def _rank_pids(pids: str) -> dict[str, str]:
  """rank -> pid, as the ranks wrote them into the directory `pids` (a file being written reads as no pid yet)."""
  out = {}
  for f in os.listdir(pids):
    try: pid = Path(pids, f).read_text().strip()
    except OSError: continue
    if pid.isdigit(): out[f] = pid
  return out


def _watch_ranks(pids: str, nproc: int, first_gone: list[set[str]], stop: threading.Event) -> None:
  """Until `stop`: every few ms, which ranks' processes no longer exist; the first poll to find any puts them, as a set,
  in first_gone (two found in one poll are both there: then it can't say which failed). The directory is read until
  all `nproc` ranks have written their pids; then a poll asks whether each has ended (_ended)."""
  known: dict[str, int] = {}
  while not first_gone and not stop.wait(0.002):
    if len(known) < nproc:
      for rank, pid in _rank_pids(pids).items(): known.setdefault(rank, int(pid))
    gone = {rank for rank, pid in known.items() if _ended(pid)}
    if gone: first_gone.append(gone)


_PF_EXITING = 0x4   # linux/sched.h: the task is exiting


def _stat_ended(stat: bytes) -> bool:
  """From a /proc/PID/stat line: a zombie (Z, X), or a process whose exit has begun (PF_EXITING in its flags)."""
  fields = stat[stat.rindex(b")") + 2:].split()       # state, ppid, pgrp, session, tty, tpgid, flags, ... after "(name) "
  return fields[0] in (b"Z", b"X") or bool(int(fields[6]) & _PF_EXITING)


def _ended(pid: int) -> bool:
  """Has process `pid` ended, or begun to? A process that has died is a zombie until its parent (mpiexec's proxy)
  collects it, and a signal 0 still reaches a zombie: the proxy, told of a killed rank, could stop and collect the
  others before that one, and the rank seen gone first was then one the proxy stopped (CI saw rank 0 named for a killed
  rank 1). And a killed process tears itself down for a while before it is a zombie, closing its sockets on the way: the
  other rank, its allreduce broken, could end first (CI again). So the process state is read where /proc has it: a
  zombie (Z, X) has ended, and a process whose flags hold PF_EXITING (0x4, set as its exit begins, before it closes a
  file) is ending; signal 0 answers elsewhere."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f: return _stat_ended(f.read())
  except FileNotFoundError: return True
  except (OSError, ValueError, IndexError): pass
  try: os.kill(pid, 0)
  except ProcessLookupError: return True
  except OSError: pass              # another user's process by now: alive, as far as this can tell
  return False


def _train(args, rank: int, world: int) -> int:
  lead = rank == 0                  # rank 0 alone prints, evaluates and writes
  if args.device: os.environ["UOPC_DEVICE"] = args.device
  Tensor.manual_seed(args.seed)
  history: list = []
  shape = {k: getattr(args, k) for k in ("layers", "width", "heads", "context")}
  if args.data and args.digits is not None: raise TensorError(f"--digits {args.digits} is for the addition task, not for --data {args.data}")
  if args.resume:
    src = Path(args.resume) / "model.safetensors"
    ckpt = load(src)
    model, spec = ckpt.model, ckpt.task
    for k, v in shape.items():
      if v is not None and v != getattr(model.cfg, k):
        raise TensorError(f"--resume {args.resume}: the checkpoint has {k} {getattr(model.cfg, k)}, but --{k} {v} was given")
    for k in ("digits", "data"):      # a resumed run keeps its task: a different one asked for is an error, not ignored
      if (v := getattr(args, k)) is not None and v != spec.get(k):
        learns = f"additions of {spec['digits']}-digit numbers" if spec["task"] == "addition" else f"the text {spec['data']}"
        raise TensorError(f"--resume {args.resume}: the checkpoint learns {learns}, but --{k} {v} was given")
    if spec["task"] == "addition": task = AdditionTask(spec["digits"], spec["seed"])
    else:
      try: task = TextTask(spec["data"], model.cfg.context, spec["seed"], spec["vocab"])
      except TensorError as e: raise CheckpointError(f"{src}: its training text can't be read again ({e})") from None
    if model.cfg.context < task.length - 1:
      raise CheckpointError(f"{src}: its context {model.cfg.context} is shorter than an example of its task ({task.length - 1} tokens)")
    start, history = ckpt.step, ckpt.history
  else:
    if args.data: task = TextTask(args.data, shape["context"] or 64, args.seed)
    else: task = AdditionTask(2 if args.digits is None else args.digits, args.seed)
    context = shape["context"] or (max(16, task.length - 1) if isinstance(task, AdditionTask) else 64)
    if context < task.length - 1: raise TensorError(f"--context {context} is shorter than an example ({task.length - 1} tokens)")
    model = GPT(GPTConfig(vocab=len(task.vocab), context=context, layers=shape["layers"] or 2, width=shape["width"] or 128,
                          heads=shape["heads"] or 4))
    start = 0
  peak = args.lr if args.lr is not None else ckpt.lr if args.resume else 3e-3
  opt = nn.AdamW(model.parameters(), lr=peak, weight_decay=0.01)
  rng = data_rng(args.seed, TRAIN_STREAM, start)        # a resumed run draws new batches, not the first run's again
  if args.resume and ckpt.optimizer is None and lead:
    print(f"uopc: warning: {src} has no optimizer state: AdamW starts afresh (zero moments, bias correction from step 1)", file=sys.stderr)
  elif args.resume: nn.load_state_dict(opt, ckpt.optimizer, strict=False)
  out = Path(args.out or args.resume or "gpt-run")
  if lead: out.mkdir(parents=True, exist_ok=True)
  # every rank starts from rank 0's weights and optimizer state (the same seed or checkpoint gives them all the same
  # already: this makes it so whatever a rank's machine computed)
  distributed.broadcast(model.parameters() + opt.m + opt.v)

  train_step = training_step(model, opt)
  shard = args.batch // world

  # evaluation: the loss on a fixed held-out batch (both tasks), and for addition the exact-answer accuracy
  vx, vy = task.batch(data_rng(args.seed, VAL_STREAM), args.batch, "val")
  val_step = jit(lambda x, y: model.loss(x, y, training=False))
  addition = isinstance(task, AdditionTask)
  def evaluate(final: bool = False) -> tuple[float, float | None]:
    val = float(val_step(Tensor(vx), Tensor(vy)).item())
    return val, (task.accuracy(model, limit=None if final else 500) if addition else None)
  every = max(1, args.steps // 10)
  try: from tqdm import tqdm
  except ImportError: tqdm = None
  bar = tqdm(total=args.steps, desc="uopc gpt train", unit="step", file=sys.stderr, dynamic_ncols=True) if tqdm and lead else None
  tokens_per_step = args.batch * (task.length - 1)          # positions the model reads per step
  total = start + args.steps
  t0, loss_value, val, acc = time.perf_counter(), float("nan"), None, None
  for step in range(start, total):
    opt.lr = learning_rate(peak, step, total)
    x, y = task.batch(rng, args.batch)
    if (y == -100).all():     # its loss is 0/0: a NaN that says nothing about the run, and a step that would spoil the weights
      if bar is not None: bar.close()
      raise TensorError(f"the training batch of step {step + 1} has no token to predict ({type(task).__name__} drew {len(y)} examples "
                        "with every target ignored): nothing to train on")
    if world == 1: loss_value = float(train_step(Tensor(x), Tensor(y)).item())
    else:   # this rank's rows of the batch every rank drew, weighted by its share of the targets
      mine = slice(rank * shard, (rank + 1) * shard)
      share = (y[mine] != -100).sum() / (y != -100).sum()
      loss_value = float(train_step(Tensor(x[mine]), Tensor(y[mine]), share).item())
    if not math.isfinite(loss_value):
      if bar is not None: bar.close()
      raise TensorError(f"the training loss became {loss_value} at step {step + 1}: the run diverged (try a smaller --lr than {peak:g})")
    entry = [step + 1, loss_value, None, None]
    if lead and (step + 1 - start) % every == 0 and step + 1 < total: val, acc = entry[2], entry[3] = evaluate()
    history.append(entry)
    rate = (step + 1 - start) * tokens_per_step / max(time.perf_counter() - t0, 1e-9)
    post = {"loss": f"{loss_value:.4f}"}
    if val is not None: post["val"] = f"{val:.4f}"
    if acc is not None: post["acc"] = f"{acc:.1%}"
    post["tok/s"] = f"{rate:,.0f}"
    if bar is not None:
      bar.update(1)
      bar.set_postfix(post, refresh=False)
    elif lead and (step + 1 - start) % every == 0: print(f"step {step + 1}: " + ", ".join(f"{k} {v}" for k, v in post.items()), file=sys.stderr)
  if bar is not None: bar.close()
  if not lead: return 0
  val, acc = evaluate(final=True)
  if history: history[-1][2:] = [val, acc]
  save(out / "model.safetensors", model, opt, task, total, history, peak)
  plot = plot_history(history, out / "loss.png", addition)
  print(f"saved {out / 'model.safetensors'}" + (f" and the plot {plot}" if plot else " (no plot: matplotlib is not installed)"))
  what = f"validation loss {val:.4f}"
  if addition: what += f", accuracy {acc:.1%} on {len(task.heldout)} held-out additions of numbers below {10 ** task.digits}"
  print(f"final loss {loss_value:.4f}, {what}")
  return 0


def cmd_sample(args) -> int:
  if args.device: os.environ["UOPC_DEVICE"] = args.device
  ckpt = load(Path(args.dir) / "model.safetensors")
  model, spec = ckpt.model, ckpt.task
  vocab = spec["vocab"]
  prompt = args.prompt
  if missing := sorted(set(prompt) - set(vocab)):
    raise TensorError(f"--prompt has characters the model never saw: {''.join(missing)!r} (its vocabulary: {vocab!r})")
  if not prompt: raise TensorError("--prompt is empty: give the model something to continue")
  ids = np.array([[vocab.index(c) for c in prompt]], np.int32)
  out = generate(model, ids, args.tokens, temperature=args.temperature, top_k=args.top_k, rng=np.random.default_rng(args.seed))[0]
  text = "".join(vocab[i] for i in out)
  if spec["task"] == "addition" and "\n" in text: text = text[:text.index("\n")]   # an answer ends with its line
  print(prompt + text)
  return 0


_TRAIN_ACTIONS: list = []


def register(subparsers) -> None:
  """The `uopc gpt` subcommands (the uopc.commands entry point of uopc-tensor)."""
  g = subparsers.add_parser("gpt", help="train a GPT on additions or a text file, and sample from it")
  sub = g.add_subparsers(dest="gpt_command", metavar="train|sample")
  t = sub.add_parser("train", help="train a GPT (addition by default, or --data FILE)")
  t.add_argument("--task", choices=["addition"], default="addition", help="the built-in task (default: addition)")
  t.add_argument("--data", metavar="FILE", help="train on this UTF-8 text file, character by character, instead")
  t.add_argument("--digits", type=_whole("--digits"), help="digits of each operand for addition (default 2)")
  t.add_argument("--steps", type=_whole("--steps"), default=3000, help="training steps (default 3000)")
  t.add_argument("--batch", type=_whole("--batch"), default=64, help="examples per step (default 64)")
  t.add_argument("--context", type=_whole("--context"), help="tokens the model sees (default 16 for addition, 64 for text)")
  t.add_argument("--layers", type=_whole("--layers"), help="transformer blocks (default 2)")
  t.add_argument("--width", type=_whole("--width"), help="embedding width (default 128)")
  t.add_argument("--heads", type=_whole("--heads"), help="attention heads (default 4; must divide --width)")
  t.add_argument("--lr", type=_number("--lr", 0, False), help="peak AdamW learning rate (default 3e-3; warmup, then cosine decay)")
  t.add_argument("--seed", type=_whole("--seed", 0), default=0, help="seed of the data and the initial weights (default 0)")
  t.add_argument("--device", help="backend (default: $UOPC_DEVICE, or C)")
  t.add_argument("--out", metavar="DIR", help="where model.safetensors and loss.png go (default: gpt-run, or the --resume DIR)")
  t.add_argument("--nproc", type=_whole("--nproc"),
                 help="train on N processes with MPI (runs mpiexec; needs uopc-tensor[dist]); --batch stays the global batch")
  t.add_argument("--resume", metavar="DIR", help="continue training the checkpoint in DIR (a fresh AdamW, with a warning, if it has none)")
  t.set_defaults(func=cmd_train)
  _TRAIN_ACTIONS[:] = [a for a in t._actions if a.option_strings and a.dest != "help"]   # what --nproc passes on to mpiexec
  s = sub.add_parser("sample", help="continue a prompt with a trained GPT")
  s.add_argument("dir", metavar="DIR", help="the directory `uopc gpt train --out` wrote")
  s.add_argument("--prompt", default="\n", help='the text to continue (for addition: "12+34=")')
  s.add_argument("--tokens", type=_whole("--tokens"), default=32, help="tokens to generate (default 32; past the context, a sliding window)")
  s.add_argument("--temperature", type=_number("--temperature", 0, True), default=0.0, help="0 is greedy (the default); higher is more random")
  s.add_argument("--top-k", type=_whole("--top-k"), help="sample among the k likeliest tokens only")
  s.add_argument("--seed", type=_whole("--seed", 0), default=0, help="seed of the sampling (default 0)")
  s.add_argument("--device", help="backend (default: $UOPC_DEVICE, or C)")
  s.set_defaults(func=cmd_sample)
  g.set_defaults(func=lambda args: g.print_help() or 2)
