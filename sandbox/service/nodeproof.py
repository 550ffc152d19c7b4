"""How a node proves to a gateway that it is the node, without the gateway sending the token
to an address that has not proved it first.

A gateway discovers addresses (a static list, DNS records): anything can answer there, and a
``/v1/info`` that names an existing node id is cheap to fake. So before it sends the node
token anywhere, the gateway asks ``GET /v1/node/proof?challenge=C`` (no token) and the node
answers with its id, the local address the request reached (the socket's, which a relay in
between cannot choose) and ``HMAC-SHA256(token, C | node id | address)``. The gateway checks
the HMAC with its copy of the token, and the address against the one peer it connected to
(exactly that one, not any address the node's host name resolves to: a name may have a relay
among its records): only a holder of the token, answering at that address, passes. A relay
that forwards the challenge to the real node gets a proof for the real node's address, not
its own.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re

CHALLENGE = re.compile(r"[0-9a-f]{32,128}")


def proof(token: str, challenge: str, node_id: str, address: str) -> str:
    message = f"sandbox-node-proof|{challenge}|{node_id}|{address}".encode()
    return hmac.new(token.encode(), message, hashlib.sha256).hexdigest()


def address_text(host: str, port: int) -> str:
    """One spelling of an address: ``IP:PORT``, ``[v6]:PORT``."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return f"{host.lower()}:{port}"
    return f"[{ip.compressed}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def verify(token: str, challenge: str, answer: dict, peer: str) -> str | None:
    """None when ``answer`` proves it is a node reached at ``peer`` (``address_text``), the
    address the asker connected to; else why not."""
    node_id, address, given = answer.get("node_id"), answer.get("address"), answer.get("proof")
    if not all(isinstance(v, str) and v for v in (node_id, address, given)):
        return "its proof answer lacks node_id, address or proof"
    if address != peer:
        return f"it proved to be reached at {address}, not at {peer}, the address connected to"
    if not hmac.compare_digest(given, proof(token, challenge, node_id, address)):
        return "its proof does not match the node token"
    return None
