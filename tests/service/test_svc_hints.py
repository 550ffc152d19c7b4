"""Dead ends in a sandbox without network end with one line saying what to do: a missing
package (an image with it, or egress that allows pip), a DNS look-up or a connection (egress
for the hosts), a failed `!pip install` / `%pip install`. The hint is the traceback's last
line (the error's name and value are unchanged, so stored notebooks still compare), or a
stderr line after the failed command."""

from __future__ import annotations

import support

IMAGE_WAY = "sandbox-kernel image build NAME --pip"
EGRESS_PIP = '{"egress": {"pip": true}}'


def last_line(events: list[dict]) -> tuple[str, str]:
    error = next(e for e in events if e["type"] == "error")
    return error["ename"] + ": " + error["evalue"], error["traceback"][-1]


def test_dead_ends_say_what_to_do(new_sandbox, run):
    sid = new_sandbox()["id"]
    error, hint = last_line(run(sid, "import scipy.stats"))
    assert error == "ModuleNotFoundError: No module named 'scipy'"
    assert hint.startswith("hint: this sandbox has no network") and f"{IMAGE_WAY} scipy" in hint and EGRESS_PIP in hint
    _, hint = last_line(run(sid, "import sklearn"))
    assert f"{IMAGE_WAY} scikit-learn" in hint  # the package's name, not the import's
    for code in ("import urllib.request; urllib.request.urlopen('http://example.com', timeout=5)",
                 "import socket; socket.create_connection(('1.1.1.1', 53), timeout=5)",
                 "import socket; socket.getaddrinfo('pypi.org', 443)"):
        error, hint = last_line(run(sid, code))
        assert hint.startswith("hint: this sandbox has no network") and '"egress": {"allow"' in hint, (code, error)
    # Not every OSError is the network's: no hint for a read-only path.
    _, line = last_line(run(sid, "open('/etc/x', 'w')"))
    assert "hint" not in line
    # As a user types it: the sandbox's environment makes pip fail at once and quietly (no
    # retries, each with its warning), so the failure and the hint are all there is.
    for cell in ("!pip install termcolor", "%pip install termcolor"):
        events = run(sid, cell)
        assert support.done_of(events)["status"] == "ok"
        stderr = "".join(e["text"] for e in events if e["type"] == "stream" and e["name"] == "stderr")
        assert stderr.rstrip().splitlines()[-1].startswith("hint: this sandbox has no network, so termcolor"), stderr
        shown = "".join(e["text"] for e in events if e["type"] == "stream")  # pip writes to stdout (a pty)
        assert "Retrying" not in shown and "WARNING" not in shown, shown
        assert shown.count("ERROR: ") <= 2, shown  # pip's own two lines: no version found, no distribution
    events = run(sid, "!pip --version")
    assert "hint" not in "".join(e.get("text", "") for e in events)
