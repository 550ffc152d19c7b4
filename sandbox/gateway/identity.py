"""A node's identity as the gateway holds it: the token goes only to an address that proved
it is a node (``sandbox/service/nodeproof.py``), and a node id belongs to one address at a time.

The address is the peer the gateway connects to (``discovery.Target.peer``), the one its
node client is pinned to (``pinned.py``), never the set of addresses the URL's host name
resolves to: a relay at another address of the same name forwards the challenge to the real
node and gets back a proof that names the real node's address, not the relay's.

* ``ProvenBearer``: the node client's auth. It adds the node token to a request only once the
  address has proved itself; before that (and again after the node was down, when the address
  may belong to something else by now) requests go without it.
* ``prove``: the challenge and its check against the one peer connected to.
* ``Claims``: node id -> the address that holds it. Another address claiming an id whose holder
  still answers is refused and reported (a node that came back at a new address, its old one
  down or gone, takes its id over).
"""

from __future__ import annotations

import logging
import secrets

import httpx

from ..service import nodeproof

log = logging.getLogger("sandbox.gateway.identity")


class ProvenBearer(httpx.Auth):
    def __init__(self, token: str) -> None:
        self.token = token
        self.proven = False

    def auth_flow(self, request: httpx.Request):
        if self.proven:
            request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


# Why a node that answers cannot be used, when it says it has no node id: the misconfiguration
# a gateway sees most, named as such in /v1/nodes and in a create's 503.
NO_NODE_ID = "answers, but has no node id: start it with `sandbox-kernel serve --node-id NAME`"


async def prove(client: httpx.AsyncClient, peer: str, token: str, timeout: float) -> tuple[str | None, str]:
    """(the node id it proved, "") or (None, why not). Sends no token. ``client`` connects
    only to ``peer``, and the proof must name exactly that address."""
    challenge = secrets.token_hex(32)
    try:
        r = await client.get("/v1/node/proof", params={"challenge": challenge}, timeout=timeout)
        answer = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        return None, f"not answering its proof ({type(exc).__name__})"
    if r.status_code == 404 and isinstance(answer, dict) and (answer.get("error") or {}).get("code") == "no_node_id":
        return None, NO_NODE_ID
    answer = answer if r.status_code == 200 else None
    if not isinstance(answer, dict):
        return None, f"did not prove it is a node (/v1/node/proof answered HTTP {r.status_code})"
    why = nodeproof.verify(token, challenge, answer, peer)
    if why:
        return None, f"did not prove it is a node: {why}"
    return answer["node_id"], ""


class Claims:
    def __init__(self) -> None:
        self.holder: dict[str, str] = {}  # node id -> address

    def holder_of(self, address: str) -> str | None:
        """The node id ``address`` holds, if any."""
        return next((i for i, a in self.holder.items() if a == address), None)

    def claim(self, node_id: str, address: str, holder_answers) -> str:
        """'' when ``address`` may hold ``node_id``; else why not. ``holder_answers(address)``:
        whether the current holder is still there, proven (then the claim is a duplicate)."""
        held_by = self.holder.get(node_id)
        if held_by is None or held_by == address or not holder_answers(held_by):
            if held_by not in (None, address):
                log.warning("node id %s moves from %s to %s (the former does not answer)", node_id, held_by, address)
            for other in [i for i, a in self.holder.items() if a == address and i != node_id]:
                del self.holder[other]  # one id per address: a node restarted under another name
            self.holder[node_id] = address
            return ""
        log.error("refused: %s claims node id %s, which the node at %s holds and which still answers",
                  address, node_id, held_by)
        return f"duplicate node id: claims {node_id}, held by the node at {held_by} (refused)"
