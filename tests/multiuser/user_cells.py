"""Run as a test user, with the users' venv: start one sandbox kernel through jupyter_client
(its kernelspec as pip installed it), run the given cells, shut it down, and print what a
notebook would show of each cell as JSON (stream text, notes, errors with their traceback).

    python user_cells.py KERNEL_NAME CELLS_JSON
"""

import json
import os
import sys
import tempfile

from jupyter_client.manager import KernelManager


def run(kc, code, timeout=900):
    msg_id = kc.execute(code)
    shown = {"stream": "", "notes": "", "errors": []}
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            shown["stream"] += content["text"]
        elif kind in ("display_data", "execute_result"):
            shown["notes"] += content["data"].get("text/plain", "")
        elif kind == "error":
            shown["errors"].append({"ename": content["ename"], "evalue": content["evalue"],
                                    "traceback": content["traceback"]})
        elif kind == "status" and content["execution_state"] == "idle":
            return shown


def main():
    name, cells = sys.argv[1], json.loads(sys.argv[2])
    # Unix sockets, not TCP ports another process could take between choice and bind
    km = KernelManager(kernel_name=name, transport="ipc",
                       connection_file=os.path.join(tempfile.mkdtemp(prefix="k", dir="/tmp"), "kernel.json"))
    km.start_kernel(env=dict(os.environ), cwd=os.path.expanduser("~"))
    try:
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=120)
        results = [run(kc, code) for code in cells]
        kc.stop_channels()
    finally:
        km.shutdown_kernel(now=False)
    print("RESULT " + json.dumps(results))


main()
