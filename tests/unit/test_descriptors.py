"""The server's descriptors: its soft limit raised at start, and a process that ran out is
told so (a state file that cannot be opened for want of descriptors is not a missing file:
that was how a create answered "no image named 'default'" to every user)."""

from __future__ import annotations

import json
import subprocess
import sys

import support

EXHAUST = '''
import errno, json, os, resource, sys
from sandbox.core import descriptors
from sandbox.common import statefile
path = sys.argv[1]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
out = {"raised": descriptors.raise_soft_limit() == hard}
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
out["before"] = statefile.read_json(path)
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
try:
    out["after"] = statefile.read_json(path)
except OSError as exc:
    out["after"] = f"raised {errno.errorcode[exc.errno]}"
    error = descriptors.exhausted_error(exc)
    out["answer"] = [error.status, error.code, error.message]
print(json.dumps(out))
'''


def test_running_out_of_descriptors_is_reported_as_such(tmp_path):
    state = tmp_path / "image.json"
    state.write_text(json.dumps({"name": "default"}))
    r = subprocess.run([sys.executable, "-c", EXHAUST, str(state)], capture_output=True, text=True, timeout=60,
                       cwd=str(support.REPO))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["raised"] is True
    assert out["before"] == {"name": "default"}  # control: the probe reads the file while there is room
    assert out["after"] == "raised EMFILE"
    status, code, message = out["answer"]
    assert (status, code) == (503, "out_of_descriptors") and "EMFILE, limit 64" in message
