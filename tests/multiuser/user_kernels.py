"""Run as a test user, with the users' venv: start N sandbox kernels at once through
jupyter_client on the embedded default (no SANDBOX_KERNEL_* variable), run a few cells in
each, shut them down, and print what happened as JSON.

    python user_kernels.py N OTHER_USERS_STATE_DIR
"""

import json
import os
import sys
import tempfile

from jupyter_client.manager import KernelManager

PROBE = """%%host
import os
try:
    os.listdir({other!r})
    print("reached the other user's state directory")
except PermissionError:
    print("refused")
"""


def run(kc, code, timeout=900):
    msg_id = kc.execute(code)
    out, status = [], None
    while True:
        msg = kc.get_iopub_msg(timeout=timeout)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind = msg["msg_type"]
        if kind == "stream":
            out.append(msg["content"]["text"])
        elif kind == "error":
            out.append(f"ERROR {msg['content']['ename']}: {msg['content']['evalue']}")
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            break
    return "".join(out)


def main():
    count, other = int(sys.argv[1]), sys.argv[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SANDBOX_KERNEL_")}
    managers = []
    for _ in range(count):  # all launched before any is waited for: they start at once
        # Unix sockets, not TCP ports another process could take between choice and bind
        km = KernelManager(kernel_name="sandbox", transport="ipc",
                           connection_file=os.path.join(tempfile.mkdtemp(prefix="k", dir="/tmp"), "kernel.json"))
        km.start_kernel(env=env, cwd=os.path.expanduser("~"))
        managers.append(km)
    results = []
    try:
        for km in managers:
            kc = km.client()
            kc.start_channels()
            kc.wait_for_ready(timeout=120)
            results.append({
                "cell": run(kc, "import os\nprint('answer', 6 * 7)\nopen('/workspace/mine.txt', 'w').write('x')"),
                "sandbox": run(kc, "%sandbox"),
                "probe": run(kc, PROBE.format(other=other)),
            })
            kc.stop_channels()
    finally:
        for km in managers:
            km.shutdown_kernel(now=False)
    print("RESULT " + json.dumps(results))


main()
