"""Cell code that writes raw frames straight onto its own runtime's channel, as a hostile
cell can (a cell owns its runtime's process, fd included).

Never run by the product: the red-team tests (tests/security/test_redteam_frames.py) and
the edge benchmark (bench/edge_bench.py) prepend it to their probe cells. One copy, framed
with the runtime's own header (protocol.HEADER), so that both forge what the runtime would
send. In the cell it defines `runtime` (the Runtime object, for its current execution id),
`channel` (the fd it writes frames to, on either tier), `frame(payload)` and `write_all(data)`.
"""

from __future__ import annotations

from .protocol import HEADER

FORGE_CELL = f'''
import gc, json, os, struct, time
runtime = [o for o in gc.get_objects() if type(o).__name__ == "Runtime"][0]
_link = runtime.channel.sock  # a socket (bwrap), or the pipe pair of the container's stdio (gvisor)
channel = _link.write_fd if hasattr(_link, "write_fd") else _link.fileno()
def frame(payload):
    if not isinstance(payload, bytes):
        payload = json.dumps(payload).encode()
    return struct.pack("{HEADER.format}", len(payload)) + payload
def write_all(data):
    view = memoryview(data)
    while view:
        view = view[os.write(channel, view[:1 << 20]):]
'''
