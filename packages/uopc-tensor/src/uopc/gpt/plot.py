"""uopc.gpt.plot: the loss plot `uopc gpt train` saves beside a checkpoint (matplotlib, when it is installed).

The history is [step, loss, validation loss or None, accuracy or None] per step (what a checkpoint keeps); the plot
draws the training loss, the validation losses, and for the addition task the accuracy on a second axis.
"""
from __future__ import annotations
from pathlib import Path


def plot_history(history: list, path: Path, accuracy: bool) -> Path | None:
  """Training loss by step, validation loss at each evaluation, and (for addition) accuracy on a second axis."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError: return None
  fig, ax = plt.subplots(figsize=(7, 4))
  ax.plot([h[0] for h in history], [h[1] for h in history], label="training loss", lw=0.8)
  vals = [(h[0], h[2]) for h in history if h[2] is not None]
  if vals: ax.plot(*zip(*vals), "o-", color="tab:orange", label="validation loss")
  ax.set_xlabel("step")
  ax.set_ylabel("loss (cross-entropy per predicted token)")
  ax.set_yscale("log")
  lines = ax.get_legend_handles_labels()
  accs = [(h[0], h[3]) for h in history if h[3] is not None]
  if accuracy and accs:
    ax2 = ax.twinx()
    ax2.plot(*zip(*accs), "s-", color="tab:green", label="held-out accuracy")
    ax2.set_ylabel("exact-answer accuracy")
    ax2.set_ylim(0, 1.02)
    more = ax2.get_legend_handles_labels()
    lines = (lines[0] + more[0], lines[1] + more[1])
  ax.legend(*lines, loc="center right")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
