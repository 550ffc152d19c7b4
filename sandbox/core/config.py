"""The service's settings, as traitlets (the configuration system of the Jupyter stack).

Every setting can come from the command line of ``sandbox-kernel serve`` or from an
environment variable; the defaults are what a single-user laptop or a CI box wants.
"""

from __future__ import annotations

import os
import re

from traitlets import Bool, Dict, Enum, Float, Int, List, TraitError, Unicode, default, validate
from traitlets.config import Configurable

from ..runtime import vocabulary as V

from ..common.paths import default_state_dir

MiB = 1024 * 1024
NODE_ID = re.compile(r"[a-z0-9]([a-z0-9.-]{0,38}[a-z0-9])?")
DEFAULT_PORT = 8765
DAY = 86400
SLEEP_AFTER_ENV = "SANDBOX_KERNEL_GVISOR_SLEEP_AFTER"
BWRAP_SLEEP_AFTER_ENV = "SANDBOX_KERNEL_BWRAP_SLEEP_AFTER"
BWRAP_SYSTEM_ENV = "SANDBOX_KERNEL_BWRAP_SYSTEM"
BWRAP_SYSTEMS = ("pinned", "host")


class ServiceConfig(Configurable):
    host = Unicode("", help="TCP address to listen on as well as the unix socket; empty: no TCP "
                   "unless a port is given (then 127.0.0.1).").tag(config=True)
    port = Int(0, help="TCP port to listen on as well as the unix socket; 0: no TCP unless a host is "
               f"given (then {DEFAULT_PORT}).").tag(config=True)
    multi_user = Bool(False, help="A system-wide server: its socket is open to every user (0666), each "
                      "request is tied to the caller's uid, and a user sees only their own sandboxes.").tag(config=True)
    state_dir = Unicode(help="Where tokens, images and sandboxes live.").tag(config=True)
    token = Unicode("", help="Bearer token; generated into STATE/token when empty.").tag(config=True)

    default_image = Unicode("default").tag(config=True)
    default_isolation = Enum(list(V.BACKENDS), V.BWRAP, help="The isolation backend of a create that names "
                             "none: bwrap (namespaces on the host kernel) or gvisor (runsc: a kernel of its own, "
                             "pausable).").tag(config=True)
    ttl_seconds = Int(3600, help="Idle time after which a sandbox ends; every execute renews it.").tag(config=True)
    max_lifetime_seconds = Int(DAY, help="Absolute cap on a sandbox's life.").tag(config=True)
    max_lifetime_cap_seconds = Int(14 * DAY, help="The largest max_lifetime a request may ask for.").tag(config=True)
    min_ttl_seconds = Int(1).tag(config=True)
    gvisor_sleep_after_seconds = Int(help="A gVisor sandbox with no call for this long is paused (its memory "
                                     "checkpointed to disk) and woken by its next call; its TTL and maximum "
                                     "lifetime run on as if it were up. 0: never (default 600, or "
                                     f"{SLEEP_AFTER_ENV}).").tag(config=True)
    bwrap_sleep_after_seconds = Int(help="A bwrap sandbox whose metadata names a save_label (a notebook's kept "
                                    "sandbox: the kernel sets one) with no call for this long is put to sleep "
                                    "by value: its namespace saved under that label, its processes ended; its "
                                    "next call starts a new runtime under the same id and loads the save (open "
                                    "files, sockets, threads are named as lost). 0: never (default 600, or "
                                    f"{BWRAP_SLEEP_AFTER_ENV}).").tag(config=True)
    bwrap_system = Enum(list(BWRAP_SYSTEMS), help="The system a bwrap sandbox of a venv image runs on: pinned "
                        "(its image's pinned root, the gVisor tier's tree: what the image needs, copied from the "
                        "host once; a host upgrade reaches new roots only) or host (the host's live /usr, "
                        f"read-only). Default pinned, or {BWRAP_SYSTEM_ENV}.").tag(config=True)

    memory_mb = Int(1024).tag(config=True)
    cpus = Float(1.0).tag(config=True)
    pids = Int(256).tag(config=True)
    disk_mb = Int(1024, help="Cap on /workspace (enforced where a loop-mounted filesystem can be made).").tag(config=True)
    tmp_mb = Int(256, help="Size of the sandbox's /tmp (a tmpfs, counted against its memory).").tag(config=True)
    shm_mb = Int(64, help="Size of the sandbox's /dev/shm (a tmpfs, counted against its memory).").tag(config=True)
    open_files = Int(1024).tag(config=True)
    output_bytes = Int(10 * MiB, help="Stream output one execute may produce before it is truncated.").tag(config=True)
    execute_timeout_seconds = Int(600, help="Default per-execute wall time.").tag(config=True)
    file_max_bytes = Int(100 * MiB, help="Largest file one upload may write or one download may read (by its "
                                         "apparent size: a sparse file counts whole).").tag(config=True)
    save_max_mb = Int(1024, help="Largest save of a sandbox's namespace by value (POST /v1/sandboxes/{id}/save); "
                      "a larger one is refused with a note and nothing is lost.").tag(config=True)
    saves_max_mb = Int(4096, help="Cap on the bytes of all of one owner's saves together.").tag(config=True)
    save_seconds = Int(120, help="Time bound of one save by value (inside the sandbox).").tag(config=True)
    request_max_bytes = Int(1 * MiB, help="Largest JSON request body.").tag(config=True)
    files_list_max = Int(10000, help="Directory entries one GET /files reads at most; past that the listing says "
                                      "truncated: true.").tag(config=True)
    file_delete_seconds = Int(60, help="Longest one DELETE /files may work on a tree the sandbox keeps filling; "
                                       "then it fails with 409 and what it could not remove.").tag(config=True)
    file_work_threads = Int(8, help="Threads for file work (listing, deleting, reading files), apart from the "
                                    "server's own.").tag(config=True)
    file_work_per_sandbox = Int(1, help="File-work calls of one sandbox that run at once; its others wait their "
                                        "turn, so one sandbox cannot hold every file-work thread.").tag(config=True)

    # What one sandbox may ask for (0: only the host's size bounds it) and what all the
    # live claimed sandboxes may hold together (0: no cap); see sandbox/core/capacity.py.
    max_memory_mb = Int(0, help="Largest memory_mb one sandbox may ask for (0: the host's memory).").tag(config=True)
    max_cpus = Float(0.0, help="Largest cpus one sandbox may ask for (0: the host's CPU count).").tag(config=True)
    max_pids = Int(4096, help="Largest pids one sandbox may ask for.").tag(config=True)
    max_disk_mb = Int(0, help="Largest disk_mb one sandbox may ask for (0: only the free disk bounds it).").tag(config=True)
    max_ttl_seconds = Int(14 * DAY, help="Largest ttl_seconds a create or renew may ask for.").tag(config=True)
    total_memory_mb = Int(0, help="Cap on the memory_mb of all live sandboxes together (0: the host's memory).").tag(config=True)
    memory_request_mb = Int(200, help="Memory a claimed sandbox reserves against total_memory_mb (or the host's), "
                            "like a Kubernetes request: its memory_mb stays its limit, so sandboxes may overcommit "
                            "the host while they use little (an idle one with pandas imported uses about 150 MiB). "
                            "A sandbox asking for less reserves what it asks. 0: reserve the whole limit.").tag(config=True)
    memory_reserve_mb = Int(512, help="Real memory (MemAvailable) kept free: a create or a fork that would leave "
                            "less than this beside its request first puts idle gVisor sandboxes to sleep, and is "
                            "refused (409, reason host_memory_short) if that does not free enough.").tag(config=True)
    total_cpus = Float(0.0, help="Cap on the cpus of all live sandboxes together (0: no cap).").tag(config=True)
    total_pids = Int(0, help="Cap on the pids of all live sandboxes together (0: no cap).").tag(config=True)
    total_disk_mb = Int(0, help="Cap on the disk_mb of all live sandboxes together (0: no cap beyond free disk).").tag(config=True)
    max_sandboxes = Int(0, help="Cap on the number of live sandboxes, warm pool not counted (0: no cap).").tag(config=True)
    user_share = Float(0.5, help="On a --multi-user server, the fraction of each total above (and of the host's "
                                 "memory) that one user's sandboxes may hold together; 1: no per-user cap.").tag(config=True)

    pool_size = Int(1, help="Warm sandboxes kept ready for the default image (each holds its interpreter with "
                    "the preloads, about 57 MiB: raise it where creates come in bursts).").tag(config=True)
    pool_sizes = Dict(help="Warm sandboxes per image name (overrides pool_size).").tag(config=True)
    gvisor_pool_size = Int(0, help="Warm gVisor sandboxes kept ready for the default image (where runsc can run), "
                           "so that a gVisor create (the \"Python (sandbox, gVisor)\" kernel) claims one instead "
                           "of waiting 2-4 s for its kernel to boot; each holds about 110 MB while it waits. "
                           "0: none.").tag(config=True)
    pool_preload = Bool(True, help="Warm-pool sandboxes import their image's preload modules while they wait "
                              "(numpy and pandas for the default image), so that a claimed "
                              "sandbox's first import is instant; each holds about 80 MiB more. False: warm "
                              "sandboxes import on first use, as a cold one does.").tag(config=True)
    supervisor_template = Bool(True, help="Fork each sandbox's supervisor from one process started with the "
                               "server that has imported the supervisor's code (its start takes milliseconds "
                               "instead of an interpreter's 0.2-0.9 s, and the code's memory is shared). False: "
                               "each supervisor is a new interpreter, as it is whenever the template is not "
                               "running.").tag(config=True)
    pool_idle_seconds = Int(3600, help="How long an unclaimed pooled sandbox lives.").tag(config=True)

    uid_base = Int(2_100_000, help="First host uid of the range reserved for sandboxes.").tag(config=True)
    uid_count = Int(65536).tag(config=True)
    seccomp = Bool(True).tag(config=True)
    allow_missing_protections = Bool(False, help="Start even when a protection is missing.").tag(config=True)
    delete_on_shutdown = Bool(False, help="Delete every sandbox when the server stops.").tag(config=True)
    workspace_store = Bool(True, help="Keep gVisor sandboxes' workspace images in an XFS store with reflinks "
                                      "(STATE/workspace-store, about 65 MB of disk once), so that a fork's "
                                      "workspace shares its source's blocks instead of being copied; False: "
                                      "copy (see sandbox/isolation/workspace_store.py).").tag(config=True)
    idle_stop_seconds = Int(0, help="Stop the server once it has had no request and no sandbox tied to a live "
                            "caller (a kernel) for this long; 0: never. The kernel starts its embedded server "
                            "with this set (SANDBOX_KERNEL_SERVER_IDLE_SECONDS); `serve` leaves it 0.").tag(config=True)
    pid_file = Unicode("", help="Also write the server's pid to this file while it runs (removed when it stops): "
                       "for an init system without systemd (`serve --daemon` writes STATE/server.pid). The "
                       "pid is in STATE/server.json either way.").tag(config=True)
    unsafe_test_only_layers_off = List(Unicode(), help=(
        "FOR TESTS ONLY: isolation layers to set aside (network, pid, sandboxes_dir), so that a test can "
        "prove another layer on its own. Honoured only when SANDBOX_KERNEL_UNSAFE_TEST_ONLY_LAYERS_OFF "
        "names the same layers; serve refuses to start otherwise (see sandbox/isolation/testonly.py).")).tag(config=True)

    egress_hosts = Dict(help="Names the egress proxy resolves to the given addresses before asking DNS (an "
                        "internal API's name; tests map their stand-in hosts to loopback). An address "
                        "that is not public still has to be listed in a sandbox's policy.").tag(config=True)
    egress_ca_file = Unicode("", help="Extra CA certificates (PEM) the egress proxy trusts when it opens TLS to a "
                             "host a secret is bound to (an internal API's CA).").tag(config=True)
    egress_pip_index = Unicode("", help="The package index a policy with \"pip\": true allows (default: the one "
                               "the server's own pip is configured with, if https; else PyPI).").tag(config=True)
    egress_max_connections = Int(64, help="Egress proxy connections one sandbox may have open at once; one more "
                                 "is answered 429 and closed.").tag(config=True)
    egress_head_timeout_seconds = Float(10.0, help="A proxy connection that has not sent its request head by then "
                                        "is closed.").tag(config=True)
    egress_idle_timeout_seconds = Float(120.0, help="A proxy connection that moved no byte either way for this "
                                        "long is closed.").tag(config=True)
    descriptor_reserve = Int(0, help="File descriptors the server keeps for itself: the egress proxy refuses new "
                             "connections (503) rather than take them (0: a quarter of the limit, at least 256). "
                             "The server raises its soft RLIMIT_NOFILE to the hard one at start.").tag(config=True)
    egress_insecure_plain_http_secret_hosts = List(Unicode(), help=(
        "INSECURE: hosts whose secrets the egress proxy also puts into plain http:// requests, where the value "
        "crosses the network unencrypted. By default a secret is only sent inside TLS.")).tag(config=True)
    secrets_max_per_user = Int(64, help="Secrets one user (one owner) may register.").tag(config=True)
    secrets_max_value_bytes = Int(16 * 1024, help="Largest secret value.").tag(config=True)
    secrets_max_hosts = Int(16, help="Hosts one secret may be bound to.").tag(config=True)

    node_id = Unicode("", help="This node's name in a cluster (e.g. the Kubernetes node name): it is put in every "
                      "sandbox id, so that a gateway routes each call to the node that holds the sandbox.").tag(config=True)
    image_registry = Unicode("", help="The OCI registry images move through between nodes: host[:port] (HTTPS, "
                             "certificate verified) or http://host[:port] (plain HTTP: a closed network or a test's; "
                             "every blob is still verified by digest). POST /v1/images/push and /pull use it; empty: "
                             "none.").tag(config=True)
    draining = Bool(False, help="Start draining: no new sandboxes, existing ones run out.").tag(config=True)
    usage_record_seconds = Float(60.0, help="How often each sandbox's usage record is written while it lives "
                                 "(it is also written when it ends): what a crash of its supervisor can lose.").tag(config=True)
    metrics_port = Int(0, help="Also serve /metrics without authentication on 127.0.0.1:PORT, for a local "
                       "Prometheus (0: only /metrics on the API, behind its authentication).").tag(config=True)
    metrics_owner_label = Bool(False, help="Also export the sandboxes by owner (sandbox_kernel_sandboxes_by_owner, "
                               "labelled with the user's name): one series per user, so only where the operator "
                               "wants it (a team's host; off, the labels are bounded by states, tiers and images)."
                               ).tag(config=True)

    @validate("image_registry")
    def _check_image_registry(self, proposal):
        from ..images import registry

        if proposal["value"]:
            try:
                registry.parse(proposal["value"])
            except registry.RegistryError as exc:
                raise TraitError(str(exc)) from None
        return proposal["value"].strip()

    @validate("node_id")
    def _check_node_id(self, proposal):
        value = proposal["value"]
        if value and not NODE_ID.fullmatch(value):
            raise TraitError(f"node id {value!r}: 1-40 characters, lower-case letters, digits, '-' and '.', "
                             "starting and ending with a letter or digit (a Kubernetes node name fits)")
        return value

    @default("state_dir")
    def _state_dir_default(self):
        return default_state_dir()

    @default("gvisor_sleep_after_seconds")
    def _sleep_after_default(self):
        return _seconds_from_env(SLEEP_AFTER_ENV, 600)

    @default("bwrap_sleep_after_seconds")
    def _bwrap_sleep_after_default(self):
        return _seconds_from_env(BWRAP_SLEEP_AFTER_ENV, 600)

    @default("bwrap_system")
    def _bwrap_system_default(self):
        value = os.environ.get(BWRAP_SYSTEM_ENV, "").strip() or BWRAP_SYSTEMS[0]
        if value not in BWRAP_SYSTEMS:
            raise TraitError(f"{BWRAP_SYSTEM_ENV}={value!r}: one of {', '.join(BWRAP_SYSTEMS)}")
        return value

    @validate("gvisor_sleep_after_seconds", "bwrap_sleep_after_seconds")
    def _check_sleep_after(self, proposal):
        if proposal["value"] < 0:
            raise TraitError(f"{proposal['trait'].name}: 0 (never) or more seconds")
        return proposal["value"]

    @default("token")
    def _token_default(self):
        return os.environ.get("SANDBOX_KERNEL_TOKEN", "")

    def defaults_over_maxima(self) -> list[str]:
        """Defaults the operator's own maxima forbid (each a sentence): every create that
        does not ask otherwise, and every warm sandbox, would be refused."""
        pairs = [("memory_mb", "max_memory_mb"), ("cpus", "max_cpus"), ("pids", "max_pids"), ("disk_mb", "max_disk_mb"),
                 ("ttl_seconds", "max_ttl_seconds"), ("max_lifetime_seconds", "max_lifetime_cap_seconds")]
        return [f"{default} {getattr(self, default)} > {maximum} {getattr(self, maximum)}" for default, maximum in pairs
                if getattr(self, maximum) and getattr(self, default) > getattr(self, maximum)]

    @property
    def tcp(self) -> tuple[str, int] | None:
        """(host, port) to listen on over TCP, or None: the unix socket only."""
        if not self.host and not self.port:
            return None
        return self.host or "127.0.0.1", self.port or DEFAULT_PORT

    def default_limits(self) -> dict:
        return {
            "memory_mb": self.memory_mb,
            "cpus": self.cpus,
            "pids": self.pids,
            "disk_mb": self.disk_mb,
            "tmp_mb": self.tmp_mb,
            "shm_mb": self.shm_mb,
            "open_files": self.open_files,
            "file_mb": max(self.disk_mb, self.file_max_bytes // MiB),
            "output_bytes": self.output_bytes,
            "file_bytes": self.file_max_bytes,
            "timeout_seconds": self.execute_timeout_seconds,
        }


def _seconds_from_env(name: str, fallback: int) -> int:
    """A sleep-after's default: the environment's (a kernel's embedded server is configured
    that way), else ``fallback``."""
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else fallback
    except ValueError:
        raise TraitError(f"{name}={value!r}: a whole number of seconds (0: never)") from None
