"""uopc.compile_cache: the files uopc keeps on disk between runs, and the one way uopc writes a file.

    cache_dir()                  $UOPC_CACHE_DIR, or ~/.cache/uopc (read at each use)
    write_entry(path, data)      store a cache entry: sealed, then written with write_file (its directory made if missing)
    read_entry(path)             an entry's contents, or None when it is missing or damaged (a damaged one is removed)
    write_file(path, data)       a whole file or none: written beside `path`, synced, renamed over it, the rename synced
                                 (durable=False: not synced, for sealed cache entries)
    seal(data) / unseal(blob)    SHA-256 of the contents appended after them / checked and taken off again

The cache holds compiled kernels (C shared objects, CUDA cubins, each named by a hash of everything that changes its
machine code), the Opts a timed search chose (uopc.search) and the runtime's plans (a kernel's rendered source, so a
new process doesn't lower it again). Processes share it and may be killed at any point, so:

  * a file is written to a temporary beside its name and renamed over it: a reader sees the old file or the whole new
    one, never a part, however many processes write the same entry at once;
  * every entry ends with its seal, checked on every read: a damaged entry is removed and rebuilt, never used (a
    truncated shared object makes dlopen crash the process with SIGBUS, not fail). The seal is also what a power loss
    meets: an entry is not synced to the disk (a cold GPT step wrote 100 plans and 8 kernels, 200 fsyncs, 0.17 s of its
    2.1 s here and far more on a slow disk), so one written just before it may come back torn or empty, fail its seal,
    and be built again. Files a user keeps (a checkpoint, `uopc run --save`) have no seal: write_file syncs those, the
    data and then the directory, before it returns;
  * a process killed mid-write leaves its temporary behind: write_entry removes those older than an hour from the
    directory it writes into, once per process (a younger one may be another process's write in progress).

Every other file uopc writes goes through write_file too (`uopc run --save`), so that each has the same guarantees.
This module imports no other uopc module, so every layer may use it.
"""
from __future__ import annotations
import hashlib, os, tempfile, time
from pathlib import Path
from typing import BinaryIO, Callable


def cache_dir() -> Path:
  """$UOPC_CACHE_DIR, or ~/.cache/uopc: compiled kernels and searched Opts live here (read at each use)."""
  return Path(os.environ.get("UOPC_CACHE_DIR") or Path.home() / ".cache" / "uopc")


# ---- the one writer -------------------------------------------------------------------------------------------------

def write_file(path: Path | str, data: bytes | Callable[[BinaryIO], object], make_dirs: bool = False, durable: bool = True) -> None:
  """Write `data` (bytes, or a function that writes into the file it is given) to `path` atomically and durably, with
  the mode open() would give: a temporary file beside it is written, synced and renamed over it, then the directory is
  synced, so readers and a power loss see the old file or the whole new one; a failure (a full disk, an interrupt)
  leaves no temporary behind. A symlink at `path` keeps pointing at its target, which is replaced. With make_dirs, a
  missing directory is made, and made again (once) if it is removed in between. durable=False skips the two syncs
  (readers still see a whole file): for sealed cache entries, whose seal finds what a power loss tore. OSError says
  what failed."""
  path = Path(os.path.realpath(path))
  for attempt in (0, 1):
    try:
      if make_dirs: path.parent.mkdir(parents=True, exist_ok=True)
      fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
      break
    except FileNotFoundError:
      if attempt or not make_dirs: raise
  try:
    try: os.fchmod(fd, 0o666 & ~_umask())          # mkstemp's mode is 0600
    except OSError: pass                             # a filesystem without modes (vfat, some mounts) keeps its own
    with os.fdopen(fd, "wb") as f:
      if callable(data): data(f)
      else: f.write(data)
      f.flush()
      if durable: os.fsync(fd)
    os.replace(tmp, path)
  except BaseException:
    try: os.unlink(tmp)
    except OSError: pass
    raise
  if durable: _sync_dir(path.parent)                 # the rename itself survives a crash too


def _umask() -> int:
  """This process's umask, read without changing it (os.umask sets it: a race with threads that create files)."""
  try:
    with open("/proc/self/status") as f: return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
  except (OSError, StopIteration, ValueError, IndexError): return 0o022


def _sync_dir(d: Path) -> None:
  try:
    fd = os.open(d, os.O_RDONLY)
    try: os.fsync(fd)
    finally: os.close(fd)
  except OSError: pass   # some filesystems can't sync a directory; the file itself is synced


# ---- cache entries ----------------------------------------------------------------------------------------------------

SEAL_TAG = b"uopc-sha256:"
SEAL_LEN = len(SEAL_TAG) + 32


def seal(data: bytes) -> bytes:
  """data with its SHA-256 after it (after a shared object's ELF data, where the dynamic loader never looks)."""
  return data + SEAL_TAG + hashlib.sha256(data).digest()


def unseal(blob: bytes) -> bytes | None:
  """The data a sealed blob holds, or None when the seal is missing or doesn't match it."""
  body, tag, digest = blob[:-SEAL_LEN], blob[-SEAL_LEN:-32], blob[-32:]
  return body if tag == SEAL_TAG and hashlib.sha256(body).digest() == digest else None


def write_entry(path: Path, data: bytes) -> None:
  """Store `data` as the cache entry `path`: sealed, written with write_file (making the directory; not synced: the seal
  finds an entry a power loss tore), after sweeping the directory's stale temporaries. OSError when the cache can't
  take it (not a directory, read-only, full)."""
  sweep_stale_temps(path.parent)
  write_file(path, seal(data), make_dirs=True, durable=False)


def read_entry(path: Path) -> bytes | None:
  """The data of the cache entry `path`, or None when there is none (or its directory can't be read). A damaged entry
  is removed, so that its writer builds it again."""
  try: blob = path.read_bytes()
  except OSError: return None
  if (data := unseal(blob)) is not None: return data
  try: path.unlink()
  except OSError: pass
  return None


STALE_TEMP_SECONDS = 3600
_swept: set[Path] = set()


def sweep_stale_temps(directory: Path) -> None:
  """Remove the temporaries (.NAME.XXXX.tmp) that processes killed mid-write left in `directory`, once per process and
  directory; only those older than STALE_TEMP_SECONDS (a younger one may be another process's write in progress)."""
  if directory in _swept: return
  _swept.add(directory)
  try:
    for f in directory.glob(".*.tmp"):
      try:
        if time.time() - f.stat().st_mtime > STALE_TEMP_SECONDS: f.unlink()
      except OSError: pass
  except OSError: pass


__all__ = ["cache_dir", "write_file", "write_entry", "read_entry", "seal", "unseal", "sweep_stale_temps", "STALE_TEMP_SECONDS",
           "SEAL_TAG", "SEAL_LEN"]
