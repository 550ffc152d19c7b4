"""State by value: the user namespace written to a file, and read back, inside the sandbox.

Where a process cannot be checkpointed (the bubblewrap tier), what an analyst keeps from one
day to the next is mostly data: frames, arrays, fitted models, dicts of results. This module
pickles those *inside the sandbox* (cloudpickle when the image has it, so lambdas and classes
defined in cells go by value; the standard pickler otherwise) and a new sandbox loads them.
The host copies the file's bytes and never unpickles them: a pickle runs code, and only a
sandbox may run what a sandbox wrote.

Arrays and frames take pickle protocol 5's out-of-band buffers: their memory is written to
the file as it is, after the pickle stream, with no copy into the stream, and read back into
buffers the arrays then wrap (bench/README.md, "State by value", has the numbers against
in-band pickling and parquet).

A save is bounded: ``max_bytes`` (the file, refused before the buffers are written when the
stream and buffers add up past it) and ``seconds`` (checked at every write). A refused save
removes its partial file and leaves the namespace as it was. What cannot be saved (open
files, sockets, threads, generators, locks) is named with its type; modules are saved by
name and imported again.

The file: the pickle stream, each buffer, then a JSON trailer (sizes, the pickler, what was
saved and lost) and the trailer's length as 8 bytes; the sandbox alone reads any of it.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import sys
import time
import types

FORMAT = 1
TRAILER = struct.Struct(">Q")
CHUNK = 8 * 1024 * 1024
NAMES_LISTED = 200  # names listed per kind in a summary; the counts are always whole
# IPython's own names in the user namespace: its history and helpers, not the user's state.
SHELL_NAMES = frozenset({"In", "Out", "exit", "quit", "get_ipython", "_ih", "_oh", "_dh", "_sh"})


class SaveRefused(Exception):
    """A save that would pass its size or time bound; ``note`` says which, for the user."""


def _cloudpickle() -> types.ModuleType | None:
    """cloudpickle, where the image has it (the default image does; a bare image saves with
    the standard pickler). Imported at the first save, not when the runtime starts: with
    the uuid and platform modules it brings, it is about 0.3 MiB of every sandbox, and most
    sandboxes never save."""
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - depends on the image
        return None
    return cloudpickle


def pickler_name() -> str:
    pickler = _cloudpickle()
    if pickler is not None:
        return f"cloudpickle {getattr(pickler, '__version__', '?')}"
    return f"pickle (protocol {pickle.HIGHEST_PROTOCOL})"


def _dumps_into(obj, stream, buffers: list) -> None:
    pickler = _cloudpickle()
    if pickler is not None:
        pickler.dump(obj, stream, protocol=5, buffer_callback=buffers.append)
    else:
        pickle.dump(obj, stream, protocol=5, buffer_callback=buffers.append)


def _type_name(value) -> str:
    kind = type(value)
    module = getattr(kind, "__module__", "")
    return kind.__qualname__ if module in ("builtins", "__main__", None) else f"{module}.{kind.__qualname__}"


def user_names(shell) -> list[str]:
    """The names a user made: not IPython's own (``In``, ``_i3``, ``_``) nor hidden ones."""
    hidden = getattr(shell, "user_ns_hidden", {})
    return sorted(n for n in shell.user_ns if not n.startswith("_") and n not in SHELL_NAMES and n not in hidden)


def why_unsaveable(value) -> str | None:
    """Why a value cannot be saved, known from its type alone (no pickling attempt)."""
    if isinstance(value, io.IOBase) or type(value).__name__ in ("TextIOWrapper", "BufferedReader", "BufferedWriter"):
        return "an open file: its descriptor ends with the sandbox"
    if isinstance(value, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
        return "a running generator or coroutine: its frame cannot be saved"
    module = type(value).__module__ or ""
    if module in ("socket", "ssl") or module.startswith(("threading", "_thread", "multiprocessing", "subprocess")):
        return f"a live {module.split('.')[0]} object: it belongs to this process"
    return None


class _Bounded:
    """A file writer that refuses to pass ``max_bytes`` or ``deadline`` (checked at each write)."""

    def __init__(self, raw, max_bytes: int, deadline: float):
        self.raw, self.max_bytes, self.deadline, self.written = raw, max_bytes, deadline, 0

    def write(self, data) -> int:
        size = memoryview(data).nbytes
        if self.written + size > self.max_bytes:
            raise SaveRefused(f"the save is larger than its {self.max_bytes} byte cap")
        if time.monotonic() > self.deadline:
            raise SaveRefused("the save took longer than its time bound")
        self.raw.write(data)
        self.written += size
        return size


class _Counting:
    """A writer that only counts: used to find which names cannot be pickled."""

    def write(self, data) -> int:
        return memoryview(data).nbytes


def _summary_list(items: list[dict]) -> list[dict]:
    return items[:NAMES_LISTED]


def save(shell, path: str, max_bytes: int, seconds: float) -> dict:
    """Write the user namespace to ``path``; the summary says what was saved and what was not.

    Raises SaveRefused (the partial file removed, nothing in the namespace touched) past a bound.
    """
    started = time.monotonic()
    deadline = started + seconds
    values, modules, lost = {}, {}, []
    for name in user_names(shell):
        value = shell.user_ns[name]
        if isinstance(value, types.ModuleType):
            modules[name] = value.__name__
            continue
        why = why_unsaveable(value)
        if why is None:
            values[name] = value
        else:
            lost.append({"name": name, "type": _type_name(value), "why": why})
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try:
        written, buffers = _write(path, values, modules, lost, max_bytes, deadline)
    except BaseException:  # refused, out of disk, interrupted: no partial file is left
        _remove(path)
        raise
    return {"bytes": written, "pickler": pickler_name(), "seconds": round(time.monotonic() - started, 3),
            "saved": _summary_list([{"name": n, "type": _type_name(v)} for n, v in values.items()]),
            "saved_count": len(values), "modules": _summary_list([{"name": n, "module": m} for n, m in modules.items()]),
            "lost": _summary_list(lost), "lost_count": len(lost), "buffers": buffers}


def _write(path: str, values: dict, modules: dict, lost: list, max_bytes: int, deadline: float) -> tuple[int, int]:
    with open(path, "wb") as raw:
        out = _Bounded(raw, max_bytes, deadline)
        buffers: list = []
        try:
            _dumps_into(values, out, buffers)
        except SaveRefused:
            raise
        except Exception:
            # Some value cannot be pickled: name each one that fails alone, then save the rest.
            for name in list(values):
                try:
                    _dumps_into(values[name], _Counting(), [])
                except Exception as exc:
                    lost.append({"name": name, "type": _type_name(values.pop(name)),
                                 "why": f"{type(exc).__name__}: {str(exc)[:200]}"})
            raw.seek(0)
            raw.truncate()
            out.written, buffers = 0, []
            _dumps_into(values, out, buffers)
        stream_bytes = out.written
        views = [b.raw() for b in buffers]
        total = stream_bytes + sum(v.nbytes for v in views)
        if total > max_bytes:
            raise SaveRefused(f"the save would be {total} bytes, more than its {max_bytes} byte cap")
        for view in views:
            for start in range(0, view.nbytes, CHUNK):
                out.write(view[start:start + CHUNK])
        trailer = json.dumps({"format": FORMAT, "pickler": pickler_name(), "python": sys.version.split()[0],
                              "stream_bytes": stream_bytes, "buffers": [v.nbytes for v in views],
                              "modules": modules, "lost": lost}).encode()
        out.max_bytes += len(trailer) + TRAILER.size  # the trailer is the file's own bookkeeping
        out.write(trailer)
        out.write(TRAILER.pack(len(trailer)))
        return out.written, len(views)


def restore(shell, path: str) -> dict:
    """Load a save made by ``save`` into the user namespace; the summary says what came back
    and what did not (a module the new image lacks, a value whose class is gone)."""
    started = time.monotonic()
    with open(path, "rb") as f:
        f.seek(-TRAILER.size, os.SEEK_END)
        (length,) = TRAILER.unpack(f.read(TRAILER.size))
        f.seek(-TRAILER.size - length, os.SEEK_END)
        trailer = json.loads(f.read(length))
        if trailer.get("format") != FORMAT:
            raise ValueError(f"this save's format {trailer.get('format')!r} is not one this runtime reads")
        f.seek(0)
        stream = f.read(trailer["stream_bytes"])
        buffers = []
        for size in trailer["buffers"]:
            buffer = bytearray(size)
            f.readinto(buffer)
            buffers.append(buffer)
    values = pickle.loads(stream, buffers=buffers)
    shell.user_ns.update(values)
    lost = list(trailer.get("lost") or [])
    imported = []
    for name, module in (trailer.get("modules") or {}).items():
        try:
            __import__(module)
            shell.user_ns[name] = sys.modules[module]
            imported.append({"name": name, "module": module})
        except Exception as exc:
            lost.append({"name": name, "type": "module", "why": f"not importable here: {type(exc).__name__}: {exc}"})
    return {"restored": _summary_list([{"name": n, "type": _type_name(v)} for n, v in values.items()]),
            "restored_count": len(values), "modules": _summary_list(imported),
            "lost": _summary_list(lost), "lost_count": len(lost), "pickler": trailer.get("pickler"),
            "seconds": round(time.monotonic() - started, 3)}


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
