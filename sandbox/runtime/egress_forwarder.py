"""Offers the host's egress proxy on the sandbox's own loopback (``HTTP(S)_PROXY``).

The sandbox's network namespace holds nothing but loopback; the one way out is the unix
socket of the host-side proxy, bound into the sandbox. HTTP clients (pip, requests, curl)
speak to a TCP proxy, so this forwarder listens on 127.0.0.1 inside the namespace and copies
each connection, byte for byte, to that socket. It decides nothing: the policy is enforced
on the host, where the sandbox cannot change it.
"""

from __future__ import annotations

import os
import socket
import threading

SOCKET_ENV = "SANDBOX_EGRESS_SOCKET"
PORT_ENV = "SANDBOX_EGRESS_PORT"
CHUNK = 64 * 1024


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for sock, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                sock.shutdown(how)
            except OSError:
                pass


def _serve_one(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
    back.start()
    _pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def serve(path: str, port: int, ready: threading.Event | None = None) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    if ready is not None:
        ready.port = listener.getsockname()[1]
        ready.set()
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve_one, args=(client, path), daemon=True).start()


def start_from_environment() -> None:
    """Start the forwarder in a daemon thread when the sandbox was given an egress socket."""
    path, port = os.environ.get(SOCKET_ENV), os.environ.get(PORT_ENV)
    if path and port:
        threading.Thread(target=serve, args=(path, int(port)), name="egress-forwarder", daemon=True).start()
