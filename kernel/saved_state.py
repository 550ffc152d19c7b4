"""A notebook's variables saved by value: `%sandbox save`, `%sandbox restore`, `%sandbox forget`,
and the restore a notebook's next kernel does when the sandbox it kept is gone.

The sandbox saves and loads its own namespace (the server keeps the bytes and never loads
them, sandbox/core/saving.py); the kernel only names the save by its notebook (``label``),
asks for it, and tells the user what came back, what did not, and how old it is.
"""

from __future__ import annotations

import typing as t

from sandbox.client import AsyncSandbox, SandboxError, ServerConfig
from sandbox.client.async_client import delete_save, last_save_failure, list_saves

from .failure import CellFailure
from .outputs import format_duration

USAGE = ("%sandbox save: save this notebook's variables by value (they come back in its next sandbox); "
         "%sandbox restore [SAVE_ID]: load the newest save (or SAVE_ID) into this sandbox; "
         "%sandbox forget [SAVE_ID]: delete this notebook's saves (or one)")
NAMES_SHOWN = 12
SAVE_NOT_FOUND = "save_not_found"  # the server's code for a save that is not there


def label_of(keeper: t.Any) -> str | None:
    """The save label of the notebook a kernel keeps (None: no notebook, or another kernel holds it)."""
    lease = getattr(keeper, "lease", None)
    return f"notebook:{lease.path.stem}" if lease is not None and keeper.keeping else None


def _names(items: list[dict[str, t.Any]], count: int | None, with_type: bool = True) -> str:
    shown = [f"{i.get('name')} ({i.get('type')})" if with_type else str(i.get("name")) for i in items[:NAMES_SHOWN]]
    more = max(len(items), count or 0) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _lost(items: list[dict[str, t.Any]], count: int | None) -> str:
    shown = [f"{i.get('name')} ({i.get('type')}: {i.get('why')})" for i in items[:NAMES_SHOWN]]
    more = max(len(items), count or 0) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def saved_note(save: dict[str, t.Any]) -> str:
    summary = save.get("summary") or {}
    size = f"{(save.get('bytes') or 0) / 2**20:.1f} MiB"
    text = f"saved {summary.get('saved_count', 0)} variables by value as {save.get('id')} ({size})"
    if summary.get("saved"):
        text += f": {_names(summary['saved'], summary.get('saved_count'), with_type=False)}"
    if summary.get("lost"):
        text += f"\nnot saved: {_lost(summary['lost'], summary.get('lost_count'))}"
    return text + "\n"


def restored_note(restored: dict[str, t.Any]) -> str:
    """What came back, what did not, and how old it is: the first cell of a restored notebook."""
    save = restored.get("save") or {}
    age = format_duration(float(save.get("age_seconds") or 0))
    if restored.get("error"):
        return f"this notebook's variables saved {age} ago ({save.get('id')}) could not be loaded: {restored['error']}\n"
    text = f"restored this notebook's variables saved {age} ago ({save.get('id')})"
    if restored.get("restored"):
        text += f": {_names(restored['restored'], restored.get('restored_count'))}"
    if restored.get("modules"):
        text += f"; imported again: {_names(restored['modules'], None, with_type=False)}"
    if restored.get("lost"):
        text += f"\nnot restored: {_lost(restored['lost'], restored.get('lost_count'))}"
    return text + "\n"


async def newest_save(config: ServerConfig, label: str | None) -> dict[str, t.Any] | None:
    saves = await list_saves(label, config=config)
    return saves[0] if saves else None


async def to_restore(keeper: t.Any, config: ServerConfig) -> str | None:
    """The save a notebook's new sandbox starts from: its newest, when the sandbox the notebook
    kept is gone (not after a restart or `%sandbox new`, which mean a fresh interpreter)."""
    label = label_of(keeper)
    if label is None or not getattr(keeper, "lost_sandbox", None):
        return None
    keeper.lost_sandbox = None
    failure = await last_save_failure(label, config=config)
    if failure:
        keeper.note = (keeper.note or "") + (f"this notebook's variables could not be saved before its sandbox "
                                             f"ended: {failure.get('message')}\n")
    return (await newest_save(config, label) or {}).get("id")


def woke_by_value_note(info: t.Any) -> str | None:
    """What a kept sandbox's resume said when it slept by value (the bwrap tier's sleep: a new
    process, the variables loaded from the save it slept with): None for any other resume,
    whose variables are all still there."""
    note = info.raw.get("wake_note")
    if not isinstance(note, str) or "restored by value" not in note:
        return None
    return f"this notebook's sandbox {info.id} " + note.strip().removeprefix("[sandbox: it ").removesuffix("]") + "\n"


def metadata(keeper: t.Any) -> dict[str, str]:
    """The sandbox's metadata that names its notebook's saves (the server's own saves at the
    sandbox's end take this label, so the next kernel finds them)."""
    label = label_of(keeper)
    return {"save_label": label} if label else {}


async def run_saved_state(args: list[str], sbx: AsyncSandbox, config: ServerConfig, label: str | None) -> str:
    """`%sandbox save|restore|forget`: the text the cell shows. A save that is not there is the
    cell's error, not the sandbox's: the kernel keeps its sandbox."""
    try:
        return await _run(args, sbx, config, label)
    except SandboxError as exc:
        if exc.code == SAVE_NOT_FOUND:
            raise CellFailure("SaveNotFound", f"%sandbox {args[0]}: {exc.message}") from None
        raise


async def _run(args: list[str], sbx: AsyncSandbox, config: ServerConfig, label: str | None) -> str:
    verb, rest = args[0], args[1:]
    if len(rest) > 1 or (verb == "save" and rest):
        raise CellFailure("UsageError", USAGE)
    if verb == "save":
        return saved_note(await sbx.saves.save(label))
    if verb == "restore":
        save_id = rest[0] if rest else (await newest_save(config, label) or {}).get("id")
        if save_id is None:
            return "no saved variables for this notebook (%sandbox save makes one)\n"
        return restored_note(await sbx.saves.restore(save_id))
    if rest:
        ids = rest
    else:  # without a notebook there is no "this notebook's": forget only what is named
        ids = [s["id"] for s in await list_saves(label, config=config)] if label else []
    if not ids:
        return "nothing to forget: %sandbox forget SAVE_ID names one (this kernel serves no notebook)\n"
    for save_id in ids:
        await delete_save(save_id, config=config)
    return f"forgot {len(ids)} save(s): {', '.join(ids)}\n"
