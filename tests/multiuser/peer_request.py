"""One HTTP request over a unix socket, with the standard library only: run by the test
users (through `runuser`) with Debian's /usr/bin/python3, which they can execute. Prints
{"status": ..., "body": ...} as JSON; an error connecting prints {"error": ...}.

    python3 peer_request.py SOCKET METHOD PATH [JSON-BODY]
"""

import http.client
import json
import socket
import sys


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("sandbox-kernel", timeout=120)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(120)
        self.sock.connect(self.path)


def main() -> None:
    sock, method, path = sys.argv[1:4]
    body = sys.argv[4] if len(sys.argv) > 4 else None
    conn = UnixConnection(sock)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        response = conn.getresponse()
        raw = response.read().decode()
    except OSError as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return
    try:
        parsed = json.loads(raw)
    except ValueError:  # NDJSON (execute): a list of events
        parsed = [json.loads(line) for line in raw.splitlines() if line.strip()]
    print(json.dumps({"status": response.status, "body": parsed}))


main()
