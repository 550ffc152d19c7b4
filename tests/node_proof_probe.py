"""The probe and the control of the gateway's node-proof tests (a relay at a second address of
a node's host name).

* Run as a script, a **relay that records what it is sent**:
  ``python node_proof_probe.py LISTEN_IP PORT TARGET_URL RECORD_PATH``. It listens on
  ``LISTEN_IP:PORT`` and passes every request on to the node at ``TARGET_URL`` as it came,
  Authorization header included (a man in the middle would), and the answer back; each
  request's sender, method, path and Authorization header go to ``RECORD_PATH`` as a JSON line
  first.
  Standard library only: it runs on a host of its own (a network namespace) too.
* ``Recording``: what the relay was sent, read back by the test.
* ``loosened_gateway``: the control's gateway, the real one with a single change, its proof
  check loosened back to what it was: a proof may name *any* address of the node URL's host
  name, not only the peer the gateway connected to.
"""

from __future__ import annotations

import http.client
import http.server
import json
import pathlib
import sys
import threading
import urllib.parse

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class Recording:
    def __init__(self, path: pathlib.Path):
        self.path = path

    def requests(self, client: str | None = None) -> list[dict]:
        """What it was sent (by ``client``, an IP address, if given)."""
        try:
            lines = self.path.read_text().splitlines()
        except FileNotFoundError:
            return []
        sent = [json.loads(line) for line in lines if line.endswith("}")]
        return [r for r in sent if client is None or r["client"] == client]

    def with_token(self, token: str, client: str | None = None) -> list[dict]:
        """The requests that carried ``token`` (what the relay could steal)."""
        return [r for r in self.requests(client) if token in r["authorization"]]

    def paths(self, client: str | None = None) -> set[str]:
        return {r["path"].partition("?")[0] for r in self.requests(client)}

    def proofs_asked(self, client: str | None = None) -> int:
        return sum(1 for r in self.requests(client) if r["path"].startswith("/v1/node/proof"))


# The control's gateway: ``[sys.executable, "-c", LOOSENED_GATEWAY, ADDRESSES, "gateway", ...]``
# with ADDRESSES the host name's addresses as a proof spells them (``IP:PORT``, comma-separated).
LOOSENED_GATEWAY = """
import runpy, sys
from sandbox.service import nodeproof

names_addresses = set(sys.argv.pop(1).split(","))
exact = nodeproof.verify

def any_address_of_the_name(token, challenge, answer, peer):
    named = answer.get("address")
    return exact(token, challenge, answer, named if named in names_addresses else peer)

nodeproof.verify = any_address_of_the_name
sys.argv[0] = "sandbox"
runpy.run_module("sandbox", run_name="__main__", alter_sys=True)
"""


def loosened_gateway(python: str, names_addresses: list[str]) -> list[str]:
    """The argv that runs ``sandbox`` (append ``gateway`` and its arguments) with the loosened check."""
    return [python, "-c", LOOSENED_GATEWAY, ",".join(names_addresses)]


def serve(listen_ip: str, port: int, target: str, record: pathlib.Path) -> None:
    parts = urllib.parse.urlsplit(target)
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def relay(self) -> None:
            with lock, open(record, "a") as out:
                out.write(json.dumps({"client": self.client_address[0], "method": self.command, "path": self.path,
                                      "authorization": self.headers.get("authorization") or ""}) + "\n")
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP | {"content-length"}}
            upstream = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
            try:
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in HOP_BY_HOP | {"content-length"}:
                        self.send_header(key, value)
            except OSError as exc:
                data = json.dumps({"error": {"code": "relay", "message": str(exc)}}).encode()
                self.send_response(502)
            finally:
                upstream.close()
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = relay

        def log_message(self, *args) -> None:
            pass

    http.server.ThreadingHTTPServer((listen_ip, port), Handler).serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), sys.argv[3], pathlib.Path(sys.argv[4]))
