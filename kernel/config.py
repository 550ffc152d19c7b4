"""The kernel's settings: traitlets, each with an environment-variable fallback.

Environment variables are the way to configure a kernel per kernelspec (the spec's `env`)
or per launch, which is what notebook servers offer; the traits are there for
`--SandboxKernel.ttl_seconds=600` on the kernel's command line. The kernel reads no
config file of its own: two notebooks open in the same Jupyter should not silently share
a hidden file's settings.

Each trait's `env` tag names its variable; docs/kernel.md's table of settings is made from these
traits (scripts/kernel_settings_table.py), and a unit test checks that the table is current
and that every tagged variable really sets its trait.
"""

from __future__ import annotations

import json
import logging
import os
import typing as t

from traitlets import Bool, Dict, Float, Integer, Unicode, default
from traitlets.config import Configurable

log = logging.getLogger(__name__)


def env_value(name: str, cast: t.Callable[[str], t.Any]) -> t.Any:
    """The value of environment variable `name`, cast; None if unset, empty or malformed.

    A malformed value is logged and ignored rather than stopping the kernel from starting:
    a kernel that cannot start shows the user nothing at all.
    """
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return cast(raw)
    except (TypeError, ValueError):
        log.warning("ignoring %s=%r: not a valid %s", name, raw, getattr(cast, "__name__", "value"))
        return None


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(raw)


class SandboxSettings(Configurable):
    """Mixed into the kernel so that its traits are configured as `SandboxKernel.<name>`."""

    url = Unicode(
        None,
        allow_none=True,
        help="URL of the sandbox server (env SANDBOX_KERNEL_URL): http://HOST:PORT or "
        "unix:/path/server.sock. When unset, the kernel uses the server of its state directory, on "
        "that directory's unix socket, and starts it if nothing answers there.",
    ).tag(config=True, env="SANDBOX_KERNEL_URL")

    token = Unicode(
        None,
        allow_none=True,
        help="Bearer token (env SANDBOX_KERNEL_TOKEN); else read from <state_dir>/token.",
    ).tag(config=True, env="SANDBOX_KERNEL_TOKEN")

    state_dir = Unicode(
        None,
        allow_none=True,
        help="State directory of the local server (env SANDBOX_KERNEL_STATE_DIR); holds its "
        "socket (server.sock), its token, and server.log when the kernel starts the server.",
    ).tag(config=True, env="SANDBOX_KERNEL_STATE_DIR")

    image = Unicode(
        None, allow_none=True, help="Sandbox image (env SANDBOX_KERNEL_IMAGE); unset: the server's default image."
    ).tag(config=True, env="SANDBOX_KERNEL_IMAGE")

    ttl_seconds = Integer(
        None,
        allow_none=True,
        help="Seconds of idleness after which the sandbox expires, renewed by each cell (env SANDBOX_KERNEL_TTL); "
        "unset: the server's default; %ttl set changes it for a running kernel.",
    ).tag(config=True, env="SANDBOX_KERNEL_TTL")

    max_lifetime_seconds = Integer(
        None,
        allow_none=True,
        help="Hard cap on the sandbox's life in seconds, renewals or not (env SANDBOX_KERNEL_MAX_LIFETIME); "
        "unset: the server's default.",
    ).tag(config=True, env="SANDBOX_KERNEL_MAX_LIFETIME")

    memory_mb = Integer(
        None, allow_none=True, help="Memory limit in MB (env SANDBOX_KERNEL_MEMORY_MB); unset: the server's default."
    ).tag(config=True, env="SANDBOX_KERNEL_MEMORY_MB")
    cpus = Float(
        None, allow_none=True, help="CPU limit in cores (env SANDBOX_KERNEL_CPUS); unset: the server's default."
    ).tag(config=True, env="SANDBOX_KERNEL_CPUS")
    pids = Integer(
        None, allow_none=True, help="Process limit (env SANDBOX_KERNEL_PIDS); unset: the server's default."
    ).tag(config=True, env="SANDBOX_KERNEL_PIDS")
    disk_mb = Integer(
        None,
        allow_none=True,
        help="/workspace size limit in MB (env SANDBOX_KERNEL_DISK_MB); unset: the server's default.",
    ).tag(config=True, env="SANDBOX_KERNEL_DISK_MB")

    isolation = Unicode(
        None,
        allow_none=True,
        help="Isolation tier of the kernel's sandbox (env SANDBOX_KERNEL_ISOLATION): 'bwrap' or 'gvisor' "
        "(a kernel of its own between the code and the host's; can pause and fork). Unset: the server's "
        "default. The 'Python (sandbox, gVisor)' kernelspec sets it on the kernel's command line.",
    ).tag(config=True, env="SANDBOX_KERNEL_ISOLATION")

    egress = Dict(
        None,
        allow_none=True,
        help="Network for the sandbox through the server's egress proxy, e.g. "
        '{"allow": ["api.example.org"], "secrets": ["API_KEY"], "pip": true} (env SANDBOX_KERNEL_EGRESS, '
        "JSON); unset: no network at all.",
    ).tag(config=True, env="SANDBOX_KERNEL_EGRESS")

    execute_timeout = Float(
        None,
        allow_none=True,
        help="Seconds a cell may run before it is interrupted (env SANDBOX_KERNEL_TIMEOUT); "
        "unset: the server's default (600 s unless configured otherwise). %sandbox timeout SECONDS changes it "
        "for a running kernel, variables kept; a cell stopped by it says so.",
    ).tag(config=True, env="SANDBOX_KERNEL_TIMEOUT")

    stream_limit = Integer(
        1024 * 1024,
        help="Bytes of printed text (stdout and stderr) one cell sends to the notebook; the rest is dropped in "
        "the sandbox, and the cell ends with a note saying how much and how to get all of it (write it to a "
        "file, then %pull it) (env SANDBOX_KERNEL_STREAM_LIMIT). Below the Jupyter server's IOPub rate limit "
        "(1 MB/s over 3 s), which would otherwise drop output silently; 0: no limit of the kernel's own.",
    ).tag(config=True, env="SANDBOX_KERNEL_STREAM_LIMIT")

    @default("stream_limit")
    def _stream_limit_default(self) -> int:
        value = env_value("SANDBOX_KERNEL_STREAM_LIMIT", int)
        return 1024 * 1024 if value is None else value

    start_server = Bool(
        None,
        allow_none=True,
        help="Start the server if none answers (env SANDBOX_KERNEL_START_SERVER). Unset: "
        "only for the state directory's own server, i.e. when no URL is configured; 0: never; "
        "1: also for a configured unix socket or loopback URL (its host and port are used).",
    ).tag(config=True, env="SANDBOX_KERNEL_START_SERVER")

    server_start_timeout = Float(
        900.0,
        help="Seconds to wait for a server the kernel started; its first start builds the "
        "sandbox image (env SANDBOX_KERNEL_START_TIMEOUT).",
    ).tag(config=True, env="SANDBOX_KERNEL_START_TIMEOUT")

    server_idle_seconds = Integer(
        600,
        help="The server this kernel starts stops by itself once no kernel has used it for this many "
        "seconds (its warm pool ended, images unmounted; kept sandboxes run on); 0: never "
        "(env SANDBOX_KERNEL_SERVER_IDLE_SECONDS).",
    ).tag(config=True, env="SANDBOX_KERNEL_SERVER_IDLE_SECONDS")

    reconnect_timeout = Float(
        15.0,
        help="Seconds to keep retrying an unreachable server before failing the cell "
        "(env SANDBOX_KERNEL_RECONNECT_TIMEOUT).",
    ).tag(config=True, env="SANDBOX_KERNEL_RECONNECT_TIMEOUT")

    unsafe_trust_sandbox_outputs = Bool(
        False,
        help="DANGEROUS. Send the sandbox's outputs to the notebook exactly as IPython made them: "
        "its HTML and JavaScript then run in the notebook page with your rights over the Jupyter "
        "server (env SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS=1). Only for notebooks whose "
        "every cell you wrote yourself; ignored when host cells are off "
        "(SANDBOX_KERNEL_HOST_CELLS=0), which says cells may come from elsewhere. Off: active "
        "outputs are shown in isolated frames (see kernel/output_policy.py).",
    ).tag(config=True, env="SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS")

    airlock_root = Unicode(
        None,
        allow_none=True,
        help="The host folder %push reads from and %pull writes to (env SANDBOX_KERNEL_AIRLOCK_ROOT); "
        "unset: the kernel's working directory, which is the notebook's folder. Paths stay inside "
        "it: no absolute paths, no '..', no symlinks followed, no overwriting without --force.",
    ).tag(config=True, env="SANDBOX_KERNEL_AIRLOCK_ROOT")

    pull_max_bytes = Integer(
        1024 * 1024 * 1024,
        help="Bytes one %pull may write to the host in all (env SANDBOX_KERNEL_PULL_MAX_BYTES), counted by "
        "the files' apparent sizes: a sparse file that uses no space in the sandbox still writes every byte "
        "here. A %pull past it is refused before anything is written.",
    ).tag(config=True, env="SANDBOX_KERNEL_PULL_MAX_BYTES")

    @default("pull_max_bytes")
    def _pull_max_bytes_default(self) -> int:
        return env_value("SANDBOX_KERNEL_PULL_MAX_BYTES", int) or 1024 * 1024 * 1024

    keep_notebook_sandbox = Bool(
        True,
        help="A notebook keeps its sandbox across kernels (env SANDBOX_KERNEL_KEEP_NOTEBOOK_SANDBOX): "
        "shutting the kernel down, closing JupyterLab or the server's idle culling leave the sandbox "
        "(paused on the gVisor tier, else alive until its TTL) and the notebook's next kernel takes it "
        "back; Restart kernel still starts fresh. Only for kernels Jupyter Server starts for a notebook "
        "(JPY_SESSION_NAME); 0: every kernel's sandbox is deleted when the kernel ends.",
    ).tag(config=True, env="SANDBOX_KERNEL_KEEP_NOTEBOOK_SANDBOX")

    @default("keep_notebook_sandbox")
    def _keep_default(self) -> bool:
        value = env_value("SANDBOX_KERNEL_KEEP_NOTEBOOK_SANDBOX", _bool)
        return True if value is None else value

    @default("unsafe_trust_sandbox_outputs")
    def _unsafe_trust_default(self) -> bool:
        return bool(env_value("SANDBOX_KERNEL_UNSAFE_TRUST_SANDBOX_OUTPUTS", _bool))

    @default("airlock_root")
    def _airlock_root_default(self) -> str | None:
        return env_value("SANDBOX_KERNEL_AIRLOCK_ROOT", str)

    @default("url")
    def _url_default(self) -> str | None:
        return env_value("SANDBOX_KERNEL_URL", str)

    @default("token")
    def _token_default(self) -> str | None:
        return env_value("SANDBOX_KERNEL_TOKEN", str)

    @default("state_dir")
    def _state_dir_default(self) -> str | None:
        return env_value("SANDBOX_KERNEL_STATE_DIR", str)

    @default("image")
    def _image_default(self) -> str | None:
        return env_value("SANDBOX_KERNEL_IMAGE", str)

    @default("ttl_seconds")
    def _ttl_default(self) -> int | None:
        return env_value("SANDBOX_KERNEL_TTL", int)

    @default("max_lifetime_seconds")
    def _max_lifetime_default(self) -> int | None:
        return env_value("SANDBOX_KERNEL_MAX_LIFETIME", int)

    @default("memory_mb")
    def _memory_default(self) -> int | None:
        return env_value("SANDBOX_KERNEL_MEMORY_MB", int)

    @default("cpus")
    def _cpus_default(self) -> float | None:
        return env_value("SANDBOX_KERNEL_CPUS", float)

    @default("pids")
    def _pids_default(self) -> int | None:
        return env_value("SANDBOX_KERNEL_PIDS", int)

    @default("disk_mb")
    def _disk_default(self) -> int | None:
        return env_value("SANDBOX_KERNEL_DISK_MB", int)

    @default("isolation")
    def _isolation_default(self) -> str | None:
        return env_value("SANDBOX_KERNEL_ISOLATION", str)

    @default("egress")
    def _egress_default(self) -> dict | None:
        value = env_value("SANDBOX_KERNEL_EGRESS", json.loads)
        return value if isinstance(value, dict) else None

    @default("execute_timeout")
    def _timeout_default(self) -> float | None:
        return env_value("SANDBOX_KERNEL_TIMEOUT", float)

    @default("start_server")
    def _start_server_default(self) -> bool | None:
        return env_value("SANDBOX_KERNEL_START_SERVER", _bool)

    @default("server_start_timeout")
    def _start_timeout_default(self) -> float:
        value = env_value("SANDBOX_KERNEL_START_TIMEOUT", float)
        return 900.0 if value is None else value

    @default("server_idle_seconds")
    def _server_idle_default(self) -> int:
        value = env_value("SANDBOX_KERNEL_SERVER_IDLE_SECONDS", int)
        return 600 if value is None else value

    @default("reconnect_timeout")
    def _reconnect_default(self) -> float:
        value = env_value("SANDBOX_KERNEL_RECONNECT_TIMEOUT", float)
        return 15.0 if value is None else value

    def create_arguments(self) -> dict[str, t.Any]:
        """Keyword arguments for `AsyncSandbox.create`; None means "the server's default"."""
        return {
            "image": self.image,
            "ttl_seconds": self.ttl_seconds,
            "max_lifetime_seconds": self.max_lifetime_seconds,
            "memory_mb": self.memory_mb,
            "cpus": self.cpus,
            "pids": self.pids,
            "disk_mb": self.disk_mb,
            "egress": self.egress,
            "isolation": self.isolation,
        }
