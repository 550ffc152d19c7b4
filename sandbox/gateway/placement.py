"""Where a new sandbox goes: a pure function of the nodes' last ``/v1/info`` and the request.

A node that is draining, full (no free sandbox slot), without room for the request's memory
(the node's ``capacity.memory_mb.free``: its total less the caps of its live sandboxes), or
without the requested image gets none, unless a node published the image (pushed or pulled
it: its ``image_digests``), when one that lacks it may pull it by that digest first; those
come after the nodes that have it. Among the rest, one with a warm pooled sandbox of the
image comes first (create is then a claim, not a boot), then the one with the most free
capacity: the free fraction of its sandbox slots when it has a cap, else of its memory
(to the percent: noise in the memory figure must not outweigh the next key, the fewest
sandboxes).
Ties are broken at random, so that gateway replicas, which do not talk to each other, do
not all pick the same node.
"""

from __future__ import annotations

import random
import typing as t

from ..runtime import vocabulary as V


class Candidate(t.Protocol):
    node_id: str | None
    info: dict


def _cap(info: dict, resource: str) -> dict:
    return (info.get("capacity") or {}).get(resource) or {}


def lacks(info: dict, image: str) -> bool:
    """The node's info lists its images (its pool's keys) and ``image`` is not one of them."""
    pool = info.get("pool")
    return isinstance(pool, dict) and bool(pool) and image not in pool


def published(nodes: t.Sequence[Candidate], image: str) -> str | None:
    """The digest a node pushed or pulled ``image`` as (the first by node id), or None: what
    a node that lacks the image pulls before the sandbox is placed there."""
    for node in sorted(nodes, key=lambda n: n.node_id or ""):
        digest = (node.info.get("image_digests") or {}).get(image)
        if isinstance(digest, str) and digest:
            return digest
    return None


def refusal(info: dict, image: str, memory_mb: int | None, pullable: bool = False) -> str | None:
    """Why a node gets no new sandbox for this request, or None if it may get one.
    ``memory_mb`` None: the node's own default; ``pullable``: a node may lack the image."""
    if info.get("draining"):
        return V.NODE_DRAINING
    slots = _cap(info, "sandboxes")
    if slots.get("enforced") and (slots.get("free") or 0) <= 0:
        return f"full ({slots.get('total')} sandboxes)"
    need = memory_mb or (info.get("defaults") or {}).get("memory_mb") or 0
    memory = _cap(info, "memory_mb")
    if memory.get("free") is not None and memory["free"] < need:
        return f"{memory['free']} MiB of memory free, {need} asked"
    if lacks(info, image) and not pullable:
        return f"no image {image!r}"
    return None


def free_fraction(info: dict) -> float:
    slots = _cap(info, "sandboxes")
    if slots.get("enforced") and slots.get("total"):
        return (slots.get("free") or 0) / slots["total"]
    memory = _cap(info, "memory_mb")
    if memory.get("total"):
        return (memory.get("free") or 0) / memory["total"]
    return 0.0


def warm(info: dict, image: str) -> bool:
    return ((info.get("pool") or {}).get(image) or {}).get("ready", 0) > 0


def rank(nodes: t.Sequence[Candidate], image: str, memory_mb: int | None,
         rng: random.Random | None = None, pullable: bool = False) -> tuple[list, dict[str, str]]:
    """The nodes that may take the sandbox, best first (those that must pull the image
    last), and why each other one may not."""
    rng = rng or random
    refused: dict[str, str] = {}
    ok = []
    for node in nodes:
        why = refusal(node.info, image, memory_mb, pullable)
        if why:
            refused[node.node_id or "?"] = why
        else:
            ok.append(node)
    keyed = [(lacks(n.info, image), (not warm(n.info, image)), -round(free_fraction(n.info), 2),
              _cap(n.info, "sandboxes").get("used", 0), rng.random(), i) for i, n in enumerate(ok)]
    return [ok[k[-1]] for k in sorted(keyed)], refused


def note_placed(info: dict, image: str, from_pool: bool, memory_mb: int | None = None) -> None:
    """Count a sandbox just placed in a node's last info, until its next refresh says it
    itself: a burst of creates then spreads instead of piling on one node."""
    need = memory_mb or (info.get("defaults") or {}).get("memory_mb") or 0
    for resource, amount in (("sandboxes", 1), ("memory_mb", need)):
        entry = _cap(info, resource)
        if entry:
            entry["used"] = (entry.get("used") or 0) + amount
            if entry.get("free") is not None:
                entry["free"] = max(0, entry["free"] - amount)
    pool = (info.get("pool") or {}).get(image)
    if from_pool and pool and pool.get("ready"):
        pool["ready"] -= 1
