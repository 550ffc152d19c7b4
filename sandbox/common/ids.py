"""Sandbox ids, and the node each one lives on.

A node that has a node id (``serve --node-id``) puts it in every id it makes:
``sbx-<node>-<16 hex digits>``. A gateway reads the node back from the id alone, so it needs
no table of sandboxes: any gateway replica, or one that just restarted, routes a call to the
right node. A node id may hold dots (Kubernetes node names do); ids allow only
``[A-Za-z0-9_-]``, so a dot is written as ``_`` (node ids never contain one). Without a node
id, ids stay ``sbx-<16 hex digits>``, as a single server has always made them.
"""

from __future__ import annotations

import re
import secrets

PREFIX = "sbx-"
RANDOM_HEX = 16
_NODE_ID = re.compile(r"sbx-([a-z0-9][a-z0-9_-]*)-[0-9a-f]{16}")


def new_sandbox_id(node_id: str = "") -> str:
    random_part = secrets.token_hex(RANDOM_HEX // 2)
    if not node_id:
        return PREFIX + random_part
    return f"{PREFIX}{node_id.replace('.', '_')}-{random_part}"


def node_of(sandbox_id: str) -> str | None:
    """The node id a sandbox id names, or None for an id made without one."""
    match = _NODE_ID.fullmatch(sandbox_id)
    return match.group(1).replace("_", ".") if match else None
