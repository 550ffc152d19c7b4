"""The store of saved namespaces: bytes a sandbox wrote, kept per owner, never read as pickles.

A save (runtime/saving.py) is a pickle: loading it runs code. The host therefore treats its
bytes as opaque: it copies them out of one sandbox's workspace into ``STATE/saves/OWNER/ID/``
and later into another sandbox's workspace, where that sandbox's runtime loads them. Nothing
here (nor anywhere on the host) parses the file; ``save.json`` beside it is the host's own
record (owner, label, source sandbox, when, size, and the runtime's summary after
``clean_summary`` kept only short strings and counts from it).

Each owner (a tenant's uid on a shared server, the server's own uid otherwise) has a cap on
the bytes of all their saves together (``saves_max_mb``): a save that would pass it is
refused before it is written, and the saves already there stay.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import time

from ..common import statefile
from ..common.errors import ApiError

SAVE_ID = re.compile(r"sv-[0-9a-f]{16}")
DATA = "state.bin"
RECORD = "save.json"
LABEL_MAX = 512
SUMMARY_ITEMS = 200
TEXT_MAX = 300
SAVE_NOT_FOUND = "save_not_found"  # a 404 about a save, not a sandbox: a client keeps its sandbox


def new_id() -> str:
    return "sv-" + secrets.token_hex(8)


def _text(value, limit: int = TEXT_MAX) -> str:
    return str(value)[:limit] if isinstance(value, (str, int, float)) else ""


def clean_summary(summary) -> dict:
    """What the host keeps of a runtime's summary (untrusted JSON): lists of a few short
    strings per entry, at most SUMMARY_ITEMS each, and non-negative counts."""
    summary = summary if isinstance(summary, dict) else {}
    out: dict = {}
    for key, fields in (("saved", ("name", "type")), ("restored", ("name", "type")), ("modules", ("name", "module")),
                        ("lost", ("name", "type", "why"))):
        items = summary.get(key)
        if isinstance(items, list):
            out[key] = [{f: _text(item.get(f)) for f in fields} for item in items[:SUMMARY_ITEMS] if isinstance(item, dict)]
    for key in ("saved_count", "restored_count", "lost_count", "bytes", "buffers"):
        value = summary.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[key] = value
    for key in ("seconds",):
        value = summary.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
            out[key] = float(value)
    if isinstance(summary.get("pickler"), str):
        out["pickler"] = _text(summary["pickler"], 80)
    return out


class SaveStore:
    """``STATE/saves``: one directory per owner, one per save (its bytes and its record)."""

    def __init__(self, root: str, owner_cap_bytes: int):
        self.root = root
        self.owner_cap_bytes = owner_cap_bytes

    def owner_dir(self, owner: int | None) -> str:
        return os.path.join(self.root, str(os.getuid() if owner is None else int(owner)))

    def used_bytes(self, owner: int | None) -> int:
        return sum(r.get("bytes", 0) for r in self.list(owner))

    def room(self, owner: int | None) -> int:
        """Bytes the owner may still save (0: none)."""
        return max(0, self.owner_cap_bytes - self.used_bytes(owner))

    def list(self, owner: int | None, label: str | None = None) -> list[dict]:
        """The owner's saves, newest first (those with ``label`` only, when given)."""
        found = []
        try:
            names = os.listdir(self.owner_dir(owner))
        except FileNotFoundError:
            return []
        for name in names:
            if SAVE_ID.fullmatch(name):
                record = statefile.read_json(os.path.join(self.owner_dir(owner), name, RECORD))
                if record and (label is None or record.get("label") == label):
                    found.append(record)
        return sorted(found, key=lambda r: r.get("saved_at_epoch", 0), reverse=True)

    def get(self, owner: int | None, save_id: str) -> dict:
        if not isinstance(save_id, str) or not SAVE_ID.fullmatch(save_id):
            raise ApiError(404, SAVE_NOT_FOUND, f"no save {str(save_id)[:40]!r}: save ids look like sv- and 16 hex digits")
        record = statefile.read_json(os.path.join(self.owner_dir(owner), save_id, RECORD))
        if not record:
            raise ApiError(404, SAVE_NOT_FOUND, f"no save {save_id!r} (it was deleted, or is another user's)")
        return record

    def data_path(self, owner: int | None, save_id: str) -> str:
        return os.path.join(self.owner_dir(owner), self.get(owner, save_id)["id"], DATA)

    def delete(self, owner: int | None, save_id: str) -> dict:
        self.get(owner, save_id)
        shutil.rmtree(os.path.join(self.owner_dir(owner), save_id), ignore_errors=True)
        return {"id": save_id, "deleted": True}

    def begin(self, owner: int | None) -> tuple[str, str]:
        """A new save's id and a private directory to write it in (made whole by ``commit``)."""
        os.makedirs(self.root, mode=0o700, exist_ok=True)
        os.makedirs(self.owner_dir(owner), mode=0o700, exist_ok=True)
        save_id = new_id()
        partial = os.path.join(self.owner_dir(owner), f".partial-{save_id}")
        os.mkdir(partial, 0o700)
        return save_id, partial

    def commit(self, owner: int | None, save_id: str, partial: str, record: dict) -> dict:
        now = time.time()
        record = {**record, "id": save_id, "saved_at": statefile.iso(now), "saved_at_epoch": now,
                  "bytes": os.stat(os.path.join(partial, DATA)).st_size}
        with open(os.path.join(partial, RECORD), "w") as f:
            json.dump(record, f)
        os.rename(partial, os.path.join(self.owner_dir(owner), save_id))
        return record

    @staticmethod
    def abandon(partial: str) -> None:
        shutil.rmtree(partial, ignore_errors=True)

    # A save the server tried before a sandbox ended (its TTL, a stop) and could not make: kept
    # per label until a save under that label succeeds, so the next kernel can say why.
    def _failure_path(self, owner: int | None, label: str) -> str:
        return os.path.join(self.owner_dir(owner), f"failed-{hashlib.sha256(label.encode()).hexdigest()[:24]}.json")

    def note_failure(self, owner: int | None, label: str, record: dict) -> None:
        os.makedirs(self.owner_dir(owner), mode=0o700, exist_ok=True)
        statefile.write_json(self._failure_path(owner, label), {**record, "label": label,
                                                                  "at": statefile.iso(time.time())})

    def clear_failure(self, owner: int | None, label: str) -> None:
        try:
            os.unlink(self._failure_path(owner, label))
        except FileNotFoundError:
            pass

    def last_failure(self, owner: int | None, label: str | None) -> dict | None:
        return statefile.read_json(self._failure_path(owner, label)) if label else None


def public(record: dict) -> dict:
    """A save as the API shows it (with its age, for "how old is what came back")."""
    out = {k: record.get(k) for k in ("id", "label", "source_sandbox", "image", "saved_at", "bytes", "by", "summary")}
    out["age_seconds"] = round(max(0.0, time.time() - float(record.get("saved_at_epoch") or 0)), 1)
    return out
