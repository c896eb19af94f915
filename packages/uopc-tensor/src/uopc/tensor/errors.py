"""uopc.tensor.errors: the exceptions the frontend raises, each of the kinds PyTorch raises for the same mistake.

TensorError is both a ValueError (what NumPy users catch) and a RuntimeError (what torch raises for bad shapes), so code
written against either catches it; the narrower kinds add IndexError and TypeError. Every message names the shapes,
dtypes or values involved and what was expected.
"""


class TensorError(ValueError, RuntimeError):
  """A Tensor operation called with shapes, dtypes or arguments it can't take. It is a ValueError (what NumPy users
  catch) and a RuntimeError (what PyTorch raises for the same mistakes, so code written against torch catches it)."""


class TensorIndexError(TensorError, IndexError):
  """An index or a dimension out of range, or an index of a kind that can't index (a float, a bool mask)."""


class TensorTypeError(TensorError, TypeError, NotImplementedError):
  """An argument of a type or a value an op doesn't take: an unknown mode or reduction name, a float where bits are
  needed. (torch raises TypeError or NotImplementedError for these; this is both.)"""


class JitError(TensorError):
  """A function uopc.jit can't capture or replay faithfully (see uopc.jit)."""
