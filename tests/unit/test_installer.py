"""uv builds images from the index pip would use: pip's configuration (here ``PIP_INDEX_URL``)
is translated into uv's, and a real uv run asks that index, seen at a local index server that
counts the requests."""

from __future__ import annotations

import http.server
import os
import subprocess
import threading

import pytest

from sandbox.images.installer import Installer, pip_settings, uv_binary, uv_environment

PROBE = "sk-probe-package-that-does-not-exist"


class CountingIndex:
    """A package index on a free local port that answers 404 and records each path asked."""

    def __init__(self) -> None:
        asked = self.asked = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                asked.append(self.path)
                self.send_response(404)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def indexes():
    mirror, default = CountingIndex(), CountingIndex()
    yield mirror, default
    mirror.close()
    default.close()


def try_install(env: dict[str, str], tmp_path) -> None:
    uv = uv_binary()
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", str(venv)], check=True, env=env)
    argv = Installer().command(str(venv / "bin" / "python")) + ["--no-cache", PROBE]
    subprocess.run(argv, env=env, capture_output=True, timeout=120)  # fails: nobody has the probe


def test_pips_index_url_is_the_one_uv_asks(indexes, tmp_path, monkeypatch):
    if uv_binary() is None:
        pytest.skip("uv is not installed here (pip install uv)")
    mirror, default = indexes
    monkeypatch.setenv("PIP_INDEX_URL", mirror.url)
    settings = pip_settings()
    assert settings["index-url"] == mirror.url, settings
    base = dict(os.environ, UV_INDEX_URL=default.url)  # the index uv would use on its own
    try_install(uv_environment(settings, base), tmp_path)
    assert f"/simple/{PROBE}/" in mirror.asked, mirror.asked
    assert default.asked == []


def test_control_without_the_translation_uv_asks_its_own_index(indexes, tmp_path):
    if uv_binary() is None:
        pytest.skip("uv is not installed here (pip install uv)")
    mirror, default = indexes
    try_install(dict(os.environ, UV_INDEX_URL=default.url, UV_NO_PROGRESS="1"), tmp_path)
    assert f"/simple/{PROBE}/" in default.asked, default.asked
    assert mirror.asked == []


def test_settings_become_uvs_variables():
    env = uv_environment({"index-url": "https://mirror.example/simple", "extra-index-url": "a  b",
                          "find-links": "/opt/wheels", "no-index": "false"}, base={})
    assert env["UV_INDEX_URL"] == "https://mirror.example/simple"
    assert env["UV_EXTRA_INDEX_URL"] == "a b" and env["UV_INDEX_STRATEGY"] == "unsafe-best-match"
    assert env["UV_FIND_LINKS"] == "/opt/wheels" and "UV_NO_INDEX" not in env
