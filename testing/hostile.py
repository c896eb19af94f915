"""The check every hostile-input catalogue makes: an error of the project's own kind, with a message a user can read."""
import pytest


def raises_one_line(fn, kind, match: str | None = None, limit: int = 1000) -> str:
  """fn() raises `kind` with a non-empty one-line message under `limit` characters (containing `match`); returns it."""
  with pytest.raises(kind) as e: fn()
  msg = str(e.value)
  assert msg and "\n" not in msg and len(msg) < limit, msg
  if match is not None: assert match in msg, msg
  return msg
