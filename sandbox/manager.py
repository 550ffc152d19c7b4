"""The sandbox registry: create (claim from the warm pool), find, renew, delete, reap, re-adopt.

The manager never holds a sandbox's state in memory alone: each sandbox's supervisor writes
``state.json`` and serves a control socket, so after a server restart the manager rebuilds
its registry from the state directory and re-attaches to every supervisor still alive.
Sandboxes whose supervisor died while the server was down are reported as ``lost``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass, field

from . import capacity, checkpoints, forking, statefile, testonly
from .config import ServiceConfig
from .egress.policy import EgressPolicy
from .egress.service import EgressService, own_addresses
from .errors import ApiError
from .ids import new_sandbox_id
from .images import ImageStore
from .isolation import bwrap, disk, gvisor, host
from .isolation.host import HostResources
from .paths import StateDir
from .runtime import vocabulary as V
from .runtime.protocol import ProtocolError, read_frame, write_frame
from .tenancy import Link, Tenancy
from .usage import meter, store as usage_store

log = logging.getLogger("sandbox.manager")

MAX_STREAM_FRAME = 96 * 1024 * 1024  # one event of an execute or a command, from a supervisor
IDLE_CONNECTIONS = 2  # per sandbox: enough for a client that runs one cell after another
TOMBSTONE_SECONDS = 24 * 3600
CHECKPOINT_WAIT = 660.0  # the supervisor gives runsc checkpoint 600 s


@dataclass
class Handle:
    id: str
    dir: str
    image: str
    uid: int | None
    pid: int | None = None
    process: subprocess.Popen | None = None
    # The supervisor's state record as last heard (its replies, a cell's `done`).
    record: dict = field(default_factory=dict)
    # Open connections to the supervisor that finished an execute, kept for the next one.
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    # The supervisor's state.json as last read, and the (inode, mtime, size) it was read at.
    saved: dict | None = None
    saved_at: tuple[int, int, int] | None = None

    def saved_record(self) -> dict:
        """state.json, read again only when the supervisor replaced it (every save is a
        rename, so a new inode): it is consulted on every request."""
        path = os.path.join(self.dir, "state.json")
        try:
            found = os.stat(path)
        except OSError:
            return dict(self.record)
        key = (found.st_ino, found.st_mtime_ns, found.st_size)
        if key != self.saved_at:
            self.saved, self.saved_at = statefile.read_json(path), key
        return dict(self.saved or self.record)

    @property
    def socket(self) -> str:
        return os.path.join(self.dir, "control.sock")


def _pid_is_supervisor(pid: int | None, sandbox_dir: str) -> bool:
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().split(b"\0")
    except OSError:
        return False
    return b"sandbox.supervisor" in cmd and sandbox_dir.encode() in cmd


def _runtime_source() -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime")


class SandboxManager:
    def __init__(self, config: ServiceConfig):
        self.config = config
        self.state_dir = StateDir(config.state_dir)
        self.images = ImageStore(self.state_dir)
        self.live: dict[str, Handle] = {}
        self.ended: dict[str, dict] = {}
        self.pool: dict[str, deque[str]] = {}
        self.pool_starting: dict[str, int] = {}
        self.tasks: list[asyncio.Task] = []
        self.on_start: list = []  # coroutine functions run as tasks beside the reaper (the server's idle stop)
        self.reaping: list[subprocess.Popen] = []
        self.shutting_down = asyncio.Event()
        self.runtime_dir = ""
        self.bwrap_path: str | None = None
        self.bwrap_version: list[int] | None = None
        self.protections: list[dict] = []  # the doctor report the server started with
        self.tenancy = Tenancy()
        self.kept: list[str] = []  # sandboxes left running by stop(), for the server to report
        self.root = os.geteuid() == 0
        self.disk_quota = disk.available()[0]
        self.reserved: list[dict] = []  # limits of the creates under way, counted as used
        self.draining = config.draining  # no new sandboxes (nor pool refills); existing ones run out
        self.egress = EgressService(config.state_dir, hosts=config.egress_hosts, upstream_ca=config.egress_ca_file,
                                    own_addresses=own_addresses(config), pip_index=config.egress_pip_index)
        self.waking: dict[str, asyncio.Lock] = {}  # per paused sandbox: one restore at a time
        self.usage_store = usage_store.UsageStore(usage_store.path_in(self.state_dir.root))

    # --------------------------------------------------------------- startup
    def prepare(self, progress=print) -> None:
        """Blocking start-up work: state layout, runtime copy, default image."""
        self.state_dir.ensure()
        self.runtime_dir = self._install_runtime()
        binary = bwrap.discover()
        self.bwrap_path = bwrap.install_copy(binary, os.path.join(self.state_dir.root, "bwrap")) if binary else None
        self.bwrap_version = list(binary.version) if binary else None
        if self.images.get(self.config.default_image) is None:
            progress("building the default image once (this takes a minute or two)")
            self.images.ensure_default(progress=progress)
        else:
            self.images.refresh_default(self._sandboxes_left(), progress=progress)

    def _sandboxes_left(self) -> int:
        """How many sandboxes a previous server left that have not ended (kept running, or
        paused): the next `adopt` takes them back, so the images they run on must stay."""
        left = 0
        for sandbox_id in os.listdir(self.state_dir.sandboxes):
            record = statefile.read_json(os.path.join(self.state_dir.sandbox(sandbox_id), "state.json"))
            left += record is None or record.get("state") not in V.ENDED_STATES
        return left

    def _install_runtime(self) -> str:
        """Copy the in-sandbox runtime where sandbox uids can read it, keyed by its content."""
        src = _runtime_source()
        files = sorted(f for f in os.listdir(src) if f.endswith(".py"))
        digest = hashlib.sha256()
        for name in files:
            with open(os.path.join(src, name), "rb") as f:
                digest.update(name.encode() + b"\0" + f.read())
        dest = os.path.join(self.state_dir.runtimes, digest.hexdigest()[:16])
        pkg = os.path.join(dest, "sandbox_runtime")
        if not os.path.isdir(pkg):
            tmp = dest + f".tmp{os.getpid()}"
            os.makedirs(os.path.join(tmp, "sandbox_runtime"), exist_ok=True)
            for name in files:
                shutil.copy(os.path.join(src, name), os.path.join(tmp, "sandbox_runtime", name))
                os.chmod(os.path.join(tmp, "sandbox_runtime", name), 0o644)
            os.chmod(os.path.join(tmp, "sandbox_runtime"), 0o755)
            os.chmod(tmp, 0o755)
            try:
                os.rename(tmp, dest)
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return dest

    async def start(self) -> None:
        await self.adopt()
        self.tasks.append(asyncio.create_task(self._reaper()))
        self.tasks.append(asyncio.create_task(self._pool_keeper()))
        self.tasks.extend(asyncio.create_task(make()) for make in self.on_start)

    async def adopt(self) -> None:
        """Re-attach to every sandbox a previous server left running; report the lost ones."""
        try:
            names = os.listdir(self.state_dir.sandboxes)
        except FileNotFoundError:
            return
        for sandbox_id in names:
            d = self.state_dir.sandbox(sandbox_id)
            spec = statefile.read_json(os.path.join(d, "spec.json"))
            record = statefile.read_json(os.path.join(d, "state.json"))
            if spec is None:
                continue
            link = self.tenancy.load(sandbox_id, d)
            if record is None:
                record = {"id": sandbox_id, "state": V.LOST, "dead_reason": V.LOST}
            if record.get("state") in V.ENDED_STATES:
                self._bury(sandbox_id, record, d)
                continue
            handle = Handle(sandbox_id, d, spec["image"], spec.get("uid"), pid=record.get("supervisor_pid"), record=record)
            alive = _pid_is_supervisor(handle.pid, d)
            if record.get("state") == V.PAUSED and not alive:  # nothing runs; the next call restores it
                self.live[sandbox_id] = handle
                log.info("sandbox %s is paused (checkpoint kept)", sandbox_id)
                continue
            reply = None
            if alive:
                try:
                    reply = await self.call(handle, {"op": "status"}, timeout=5)
                except ApiError:
                    reply = None
            if reply and reply.get("state"):
                handle.record = reply["state"]
                self.live[sandbox_id] = handle
                await self.egress.reopen(sandbox_id, d, spec, spec.get("uid"))
                if handle.record.get("state") == V.POOLED:
                    self.pool.setdefault(handle.image, deque()).append(sandbox_id)
                log.info("re-attached to sandbox %s (%s)", sandbox_id, handle.record.get("state"))
                if link is not None:  # ended at once if its process exited while we were down
                    self.tenancy.watch(sandbox_id, link, self._caller_exited)
            else:
                V.advance(record, V.LOST, dead_reason=V.LOST,
                          dead_message="its processes ended while the server was not running")
                statefile.write_json(os.path.join(d, "state.json"), record)
                self._bury(sandbox_id, record, d)
                log.warning("sandbox %s was lost while the server was down", sandbox_id)

    def _bury(self, sandbox_id: str, record: dict, d: str) -> None:
        self.ended[sandbox_id] = record
        self._record_usage(sandbox_id, record)
        self.egress.close(sandbox_id)
        self.tenancy.unwatch(sandbox_id)
        # What a killed supervisor left (its cgroup, its workspace's mount); the workspaces of
        # ended sandboxes are removed, the small state file stays as a tombstone.
        HostResources.left_behind(d, record).release()
        shutil.rmtree(host.workspace_dir(d), ignore_errors=True)

    def _record_usage(self, sandbox_id: str, record: dict) -> None:
        """Complete an ended sandbox's usage record: its egress (counted here), and the row
        itself when its supervisor could not write its last (see usage/store.py)."""
        try:
            usage_store.complete(self.usage_store, record, usage_store.owner_name(self.tenancy.owner_of(sandbox_id)),
                                 statefile.iso(time.time()))
            egress = self.egress.describe(sandbox_id)
            if egress is not None:
                usage_store.add_egress(self.usage_store, sandbox_id, egress["usage"])
        except Exception:  # sqlite3.Error, OSError: reported; the sandbox is buried all the same
            log.exception("could not complete the usage record of %s", sandbox_id)

    async def stop(self) -> None:
        """End the warm pool (its sandboxes hold nobody's state) and, with
        delete_on_shutdown, every sandbox; record in `kept` those left running."""
        self.shutting_down.set()
        for task in self.tasks:
            task.cancel()
        self.tenancy.close()
        ending = [h for h in list(self.live.values())
                  if self.config.delete_on_shutdown or h.record.get("state") == V.POOLED]
        await asyncio.gather(*(self.end(h, "the server shut down") for h in ending), return_exceptions=True)
        self.kept = sorted(i for i, h in self.live.items() if h.record.get("state") != V.POOLED)

    # -------------------------------------------------------- supervisor I/O
    async def call(self, handle: Handle, request: dict, timeout: float = 30.0) -> dict:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(handle.socket), 5)
        except (OSError, asyncio.TimeoutError):
            raise self._gone_or_unavailable(handle) from None
        try:
            await write_frame(writer, request)
            reply = await asyncio.wait_for(read_frame(reader), timeout)
        except (EOFError, ProtocolError, OSError, asyncio.TimeoutError):
            raise self._gone_or_unavailable(handle) from None
        finally:
            writer.close()
        if reply.get("error"):
            raise ApiError(409 if reply["error"] == "conflict" else 503, reply["error"], reply.get("message", ""),
                           extra={"reason": reply["reason"]} if reply.get("reason") else None)
        if "state" in reply and isinstance(reply["state"], dict):
            handle.record = reply["state"]
        return reply

    def _gone_or_unavailable(self, handle: Handle) -> ApiError:
        self._check_handle(handle)
        if handle.id in self.ended:
            return self.gone_error(handle.id)
        return ApiError(503, "unavailable", f"sandbox {handle.id} is not answering")

    async def open_execute(self, handle: Handle, request: dict, op: str = V.OP_EXECUTE):
        """Hand the execute to the supervisor, then return its events as an async iterator.

        Connecting happens before the HTTP response starts, so a sandbox that cannot take
        the request gets a proper 4xx/5xx instead of a stream cut short. The connection of
        an earlier execute is reused when there is one: a connect and an accept per cell
        were a tenth of the server's time on a trivial cell.
        """
        frame = {"op": op, **request}
        while handle.idle:
            reader, writer = handle.idle.pop()
            if writer.is_closing() or reader.at_eof():
                writer.close()
                continue
            try:
                await write_frame(writer, frame)
            except OSError:
                writer.close()
                continue
            return self._execute_events(handle, reader, writer, frame)
        return self._execute_events(handle, *await self._connect_and_send(handle, frame))

    async def _connect_and_send(self, handle: Handle, frame: dict) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.open_unix_connection(handle.socket, limit=1 << 20)
        except OSError as exc:
            log.warning("cannot reach the supervisor of %s: %s", handle.id, exc)
            raise self._gone_or_unavailable(handle) from None
        try:
            await write_frame(writer, frame)
        except OSError as exc:
            writer.close()
            log.warning("cannot send to the supervisor of %s: %s", handle.id, exc)
            raise self._gone_or_unavailable(handle) from None
        return reader, writer

    async def open_command(self, handle: Handle, request: dict):
        """Start a command and return its events (the `start` event first) as an async iterator.

        The supervisor's first frame says whether the command started; a refusal (too many
        running, the sandbox ending) becomes an HTTP error before the response begins.
        Each command has a connection of its own, closed at its end: closing it early is
        what tells the supervisor that the caller went away.
        """
        reader, writer = await self._connect_and_send(handle, {"op": V.OP_COMMAND, **request})
        try:
            first = await asyncio.wait_for(read_frame(reader), 30)
        except (EOFError, ProtocolError, OSError, asyncio.TimeoutError):
            writer.close()
            raise self._gone_or_unavailable(handle) from None
        if first.get("type") != V.START:
            writer.close()
            if first.get("error") == "gone":
                await asyncio.to_thread(self._check_handle, handle, True)
                if handle.id in self.ended:
                    raise self.gone_error(handle.id)
            status = {"too_many": 429, "gone": 409}.get(first.get("error"), 503)
            raise ApiError(status, str(first.get("error") or "unavailable"), str(first.get("message") or "refused"))
        return self._command_events(handle, first, reader, writer)

    async def _command_events(self, handle: Handle, first: dict, reader: asyncio.StreamReader,
                              writer: asyncio.StreamWriter):
        yield first
        try:
            while True:
                try:
                    event = await self._next_frame(reader)
                except (EOFError, ProtocolError, OSError):
                    record, message = self._why_it_stopped(handle)
                    reason = record.get("dead_reason") or record.get("state")
                    yield V.command_done_event(
                        exit_code=None, signal=None, timed_out=False,
                        reason=reason if reason in V.REASONS else V.CRASHED, message=message, duration=0.0,
                        truncated=False, sandbox_state=record.get("state", V.DEAD))
                    return
                if event is None:
                    # Closing the connection (below) ends the command in the sandbox.
                    yield V.command_done_event(
                        exit_code=None, signal=None, timed_out=False, reason=V.SERVER_SHUTDOWN,
                        message="the sandbox server is shutting down; the command was stopped (the sandbox and "
                                "its variables are kept)", duration=0.0, truncated=False,
                        sandbox_state=handle.record.get("state", V.RUNNING))
                    return
                yield event
                if event.get("type") == V.DONE:
                    self._note_done(handle, event)
                    return
        finally:
            writer.close()

    async def _next_frame(self, reader: asyncio.StreamReader) -> dict | None:
        """The next frame a supervisor streams, or None once the server is shutting down.

        Raises as ``read_frame`` does when the stream ends or breaks. A caller that goes
        away while this waits cancels the read: nobody wants the frame.
        """
        next_frame = asyncio.ensure_future(read_frame(reader, MAX_STREAM_FRAME))
        stop = asyncio.ensure_future(self.shutting_down.wait())
        done: set = set()
        try:
            done, _ = await asyncio.wait({next_frame, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if next_frame not in done:
                next_frame.cancel()
        return next_frame.result() if next_frame in done else None

    def _why_it_stopped(self, handle: Handle) -> tuple[dict, str]:
        """After a supervisor's stream ended early: its tombstone record, and what to tell the caller."""
        self._check_handle(handle)
        record = self.ended.get(handle.id) or {}
        return record, record.get("dead_message") or record.get("end_message") or "its supervisor stopped"

    def _note_done(self, handle: Handle, done: dict) -> None:
        """A cell's or a command's `done` carries the sandbox's new expiry and state."""
        if done.get("expires_at"):  # the execute renewed the TTL: GET /v1/sandboxes shows it
            handle.record["expires_at"] = done["expires_at"]
        if done.get("sandbox_state") in V.ENDED_STATES:
            self._check_handle(handle)

    @staticmethod
    def _drop_idle(handle: Handle) -> None:
        while handle.idle:
            handle.idle.pop()[1].close()

    async def _execute_events(self, handle: Handle, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                              reused: dict | None = None):
        """Yield the events of one execute as the supervisor sends them.

        `reused` is the request when it went over a kept connection. A supervisor closes a
        connection only when it exits, so an end of file before the first event means it
        died, unless it is still alive: then the request never reached it, and is sent
        again over a new connection.
        """
        reusable = False
        try:
            while True:
                try:
                    event = await self._next_frame(reader)
                except (EOFError, ProtocolError, OSError):
                    if reused is not None and self._supervisor_alive(handle):
                        writer.close()
                        try:
                            reader, writer = await self._connect_and_send(handle, reused)
                        except ApiError:
                            pass  # it is not answering after all: reported as below
                        else:
                            reused = None
                            continue
                    record, message = self._why_it_stopped(handle)
                    reason = record.get("dead_reason") or V.CRASHED
                    yield V.reason_error_event(reason, message)
                    yield V.done_event(V.ERROR, reason=reason, execution_count=record.get("execution_count"),
                                       sandbox_state=record.get("state", V.DEAD))
                    return
                if event is None:
                    yield V.error_event("ServerShutdown", "the sandbox server is shutting down; the cell was "
                                        "interrupted (the sandbox and its variables are kept)")
                    yield V.done_event(V.ABORTED, reason=V.SERVER_SHUTDOWN,
                                       execution_count=handle.record.get("execution_count"),
                                       sandbox_state=handle.record.get("state", V.RUNNING))
                    return
                reused = None
                yield event
                if event.get("type") == V.DONE:
                    reusable = True
                    handle.record["execution_count"] = event.get("execution_count")
                    self._note_done(handle, event)
                    return
        finally:
            if reusable and len(handle.idle) < IDLE_CONNECTIONS and handle.id in self.live:
                handle.idle.append((reader, writer))
            else:
                writer.close()  # mid-cell, this tells the supervisor to interrupt the cell

    # ------------------------------------------------------------- lifecycle
    def get(self, sandbox_id: str) -> Handle:
        handle = self.live.get(sandbox_id)
        if handle is not None:
            self._check_handle(handle)
            handle = self.live.get(sandbox_id)
        if handle is None or handle.record.get("state") == V.POOLED:
            if sandbox_id in self.ended:
                raise self.gone_error(sandbox_id)
            raise self.not_found(sandbox_id)
        return handle

    @staticmethod
    def not_found(sandbox_id: str) -> ApiError:
        """Also the answer to a tenant asking for another's sandbox: ids do not leak."""
        return ApiError(404, "not_found", f"no sandbox with id {sandbox_id!r}")

    def owner_of(self, sandbox_id: str) -> int | None:
        return self.tenancy.owner_of(sandbox_id)

    def _caller_exited(self, sandbox_id: str, link: Link) -> None:
        handle = self.live.get(sandbox_id)
        if handle is None or self.shutting_down.is_set():
            return
        log.info("sandbox %s: the process that created it (pid %d) exited; ending it", sandbox_id, link.pid)
        task = asyncio.get_running_loop().create_task(
            self.end(handle, f"the process that created it (pid {link.pid}) exited"))
        self.tasks.append(task)
        task.add_done_callback(self.tasks.remove)

    def gone_error(self, sandbox_id: str) -> ApiError:
        record = self.ended[sandbox_id]
        ended_as = record.get("state", V.DEAD)
        why = record.get("dead_message") or record.get("end_message") or ""
        text = {V.EXPIRED: f"sandbox {sandbox_id} expired", V.DELETED: f"sandbox {sandbox_id} was deleted",
                V.LOST: f"sandbox {sandbox_id} was lost", V.DEAD: f"sandbox {sandbox_id} died"}.get(ended_as, ended_as)
        return ApiError(410, "gone", f"{text}: {why}" if why else text,
                        extra={"state": ended_as, "reason": record.get("dead_reason") or ended_as})

    async def _wait_for_exit(self, handle: Handle, timeout: float = 15.0) -> None:
        """Give an ending supervisor up to ``timeout`` seconds to exit, then file it as
        `_check_handle` does. It sleeps on the event loop, never in it: the server keeps
        answering every other request while one sandbox takes its time to go."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._supervisor_alive(handle) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        self._check_handle(handle)

    def _check_handle(self, handle: Handle) -> None:
        """Move a sandbox that has ended from the live registry to the ended one.

        Ended means its supervisor exited, or recorded an ended state and is tearing down
        (its exit is then reaped later, so a request right after a death already gets 410).
        """
        alive = self._supervisor_alive(handle)
        record = handle.saved_record()
        if alive and record.get("state") not in V.ENDED_STATES:
            return
        if record.get("state") == V.PAUSED:  # its supervisor exited after the checkpoint, as it should
            if alive and handle.process is not None:
                self.reaping.append(handle.process)
            handle.record, handle.process = record, None
            self._drop_idle(handle)
            return
        if alive and handle.process is not None:
            self.reaping.append(handle.process)
        if record.get("state") not in V.ENDED_STATES:
            V.advance(record, V.DEAD, dead_reason=record.get("dead_reason") or V.CRASHED,
                      dead_message=record.get("dead_message") or "its supervisor process ended unexpectedly")
        self.live.pop(handle.id, None)
        self._drop_idle(handle)
        for q in self.pool.values():
            if handle.id in q:
                q.remove(handle.id)
        self._bury(handle.id, record, handle.dir)

    @staticmethod
    def _supervisor_alive(handle: Handle) -> bool:
        if handle.process is not None:
            return handle.process.poll() is None
        return _pid_is_supervisor(handle.pid, handle.dir)

    def list(self) -> list[Handle]:
        for handle in list(self.live.values()):
            self._check_handle(handle)
        return [h for h in self.live.values() if h.record.get("state") != V.POOLED]

    def in_use(self, image: str) -> int:
        return sum(1 for h in self.live.values()
                   if image in (h.image, (self.images.get(h.image) or {}).get("base")))

    async def build_image(self, name: str, *, progress, **recipe) -> dict:
        """Build (or rebuild) an image off the event loop; the warm pool then fills for it.
        ``progress`` is called from the building thread with each line of output."""
        try:
            return await asyncio.to_thread(self.images.build, name, progress=progress, **recipe)
        finally:
            self._refill_soon()

    async def remove_image(self, name: str) -> None:
        """Remove an image no sandbox uses; its warm-pool sandboxes (nobody's yet) end with it.
        Raises ImageError (not_found, conflict) as the image store does."""
        self.images.remove(name, self.in_use)
        for sandbox_id in list(self.pool.pop(name, [])):
            if sandbox_id in self.live:
                await self.end(self.live[sandbox_id], "its image was removed")

    def _allocate_uid(self) -> int | None:
        if not self.root:
            return None
        used = {h.uid for h in self.live.values()}
        for _ in range(1000):
            uid = self.config.uid_base + secrets.randbelow(self.config.uid_count)
            if uid not in used:
                return uid
        raise ApiError(503, "unavailable", "no free sandbox uid")

    def _limits(self, request: dict) -> dict:
        limits = self.config.default_limits()
        for key in ("memory_mb", "cpus", "pids", "disk_mb"):
            if request.get(key) is not None:
                limits[key] = request[key]
        limits["file_mb"] = max(int(limits["disk_mb"]), self.config.file_max_bytes // (1024 * 1024))
        return limits

    async def create(self, request: dict, owner: int | None = None, caller=None) -> dict:
        """``owner``: the tenant's uid on a shared server; ``caller``: the peer (pid) to end
        the sandbox with when the request asks for ``end_with_caller``."""
        self._taking_new()
        image = request.get("image") or self.config.default_image
        if self.images.get(image) is None:
            raise ApiError(404, "not_found", f"no image named {image!r}; build it with: sandbox-kernel image build {image} --pip ...")
        egress = self.egress.parse(request["egress"], owner) if request.get("egress") is not None else None
        ttl = int(request.get("ttl_seconds") or self.config.ttl_seconds)
        max_life = int(request.get("max_lifetime_seconds") or self.config.max_lifetime_seconds)
        limits = self._limits(request)
        capacity.check(self.config, self.host(), limits, ttl, max_life, self.usage())
        ttl = min(ttl, max_life)
        backend = self._backend(request)
        claim = {"op": "claim", "ttl_seconds": ttl, "max_lifetime_seconds": max_life,
                 "metadata": request.get("metadata") or {}, "limits": limits}
        self.reserved.append(limits)
        try:
            # A warm sandbox was launched without egress: a policy needs a launch of its own.
            pooled_ok = egress is None and backend == V.BWRAP
            handle = await self._claim_from_pool(image, limits, claim) if pooled_ok else None
            if handle is None:
                handle = await self._spawn(image, limits, ttl, max_life, pooled=False, metadata=claim["metadata"],
                                           egress=egress, owner=owner, isolation=backend,
                                           on_idle=request.get("on_idle") or V.ON_IDLE_DELETE)
                handle.record["from_pool"] = False
        finally:
            self.reserved.remove(limits)
        link = Link.of(caller.pid) if caller is not None and request.get("end_with_caller") else None
        self.tenancy.record(handle.id, handle.dir, owner, link)
        if link is not None or (caller is not None and request.get("end_with_caller")):
            self.tenancy.watch(handle.id, link or Link(caller.pid, -1), self._caller_exited)
        self._refill_soon()
        return self.describe(handle)

    def _taking_new(self) -> None:
        """Refuse a new sandbox (a create or a fork) while the server stops or the node drains."""
        if self.shutting_down.is_set():
            raise ApiError(503, "unavailable", "the server is shutting down")
        if self.draining:
            raise ApiError(503, "unavailable", f"the node {self.config.node_id or 'server'} is draining: "
                           "it takes no new sandboxes", extra={"reason": V.NODE_DRAINING})

    def _backend(self, request: dict) -> str:
        """The isolation a create asks for (else the server's default), checked before anything starts."""
        backend = request.get("isolation") or self.config.default_isolation
        if backend == V.GVISOR:
            ok, why = gvisor.available()
            if not ok:
                raise ApiError(422, "invalid_request", f"isolation 'gvisor' is not available on this server: {why}")
        if request.get("egress") and backend == V.GVISOR:
            raise ApiError(422, "invalid_request", "egress is not available with isolation 'gvisor' yet (its proxy "
                                                   "reaches the sandbox through a host socket, which a checkpoint cannot save)")
        if request.get("on_idle") == V.ON_IDLE_PAUSE and backend != V.GVISOR:
            raise ApiError(422, "invalid_request", "on_idle 'pause' needs isolation 'gvisor' (only a gVisor sandbox "
                                                   "can be checkpointed)")
        return backend

    def host(self) -> capacity.Host:
        """The host now, its free disk less what live workspaces may still grow by."""
        committed = sum(capacity.unwritten_mb(host.workspace_image(h.dir), (h.record.get("limits") or {}).get("disk_mb", 0))
                        for h in self.live.values())
        return capacity.host_facts(self.state_dir.sandboxes, committed)

    def usage(self) -> dict:
        """What live claimed sandboxes (and creates under way) hold; the warm pool is not counted."""
        claimed = [_held(h.record) for h in self.live.values() if h.record.get("state") != V.POOLED]
        return capacity.usage(claimed + self.reserved)

    def capacity_report(self) -> dict:
        host = self.host()
        return {"host": {"memory_mb": host.memory_mb, "cpus": host.cpus, "disk_free_mb": host.disk_free_mb},
                "maxima": capacity.per_sandbox(self.config, host),
                "defaults": {k: v for k, v in self.config.default_limits().items() if k in capacity.RESOURCES}
                | {"ttl_seconds": self.config.ttl_seconds, "max_lifetime_seconds": self.config.max_lifetime_seconds},
                "capacity": capacity.report(self.config, host, self.usage())}

    def _pool_compatible(self, limits: dict, handle: Handle) -> bool:
        pooled = handle.record.get("limits", {})
        fixed = ("disk_mb", "open_files", "tmp_mb", "shm_mb", "file_mb", "output_bytes", "timeout_seconds")
        if any(pooled.get(k) != limits.get(k) for k in fixed):
            return False
        iso = handle.record.get("isolation", {})
        for key, res in (("memory_mb", "memory"), ("pids", "pids"), ("cpus", "cpu")):
            if pooled.get(key) != limits.get(key) and not str(iso.get(res, "")).startswith("cgroup"):
                return False
        return True

    async def _claim_from_pool(self, image: str, limits: dict, claim: dict) -> Handle | None:
        queue = self.pool.get(image)
        while queue:
            sandbox_id = queue.popleft()
            handle = self.live.get(sandbox_id)
            if handle is None or not self._pool_compatible(limits, handle):
                if handle is not None:
                    queue.append(sandbox_id)
                    return None
                continue
            try:
                await self.call(handle, claim)
            except ApiError:
                self._check_handle(handle)
                continue
            handle.record["from_pool"] = True
            return handle
        return None

    async def _spawn(self, image: str, limits: dict, ttl: int, max_life: int, *, pooled: bool,
                     metadata: dict | None = None, egress: EgressPolicy | None = None, owner: int | None = None,
                     isolation: str = V.BWRAP, on_idle: str = V.ON_IDLE_DELETE) -> Handle:
        image_info = self.images.get(image)
        sandbox_id = new_sandbox_id(self.config.node_id)
        d = self.state_dir.sandbox(sandbox_id)
        os.makedirs(d, mode=0o711)
        os.chmod(d, 0o711)
        uid = self._allocate_uid()
        workspace = host.workspace_dir(d)
        os.makedirs(workspace, mode=0o700)
        if uid is not None:
            os.chown(workspace, uid, uid)
        spec = {
            "id": sandbox_id, "image": image, "image_info": image_info, "uid": uid,
            "limits": limits, "ttl_seconds": ttl, "max_lifetime_seconds": max_life,
            "pooled": pooled, "metadata": metadata or {}, "runtime_dir": self.runtime_dir,
            "workspace": workspace, "seccomp": self.config.seccomp, "use_cgroups": self.root,
            "disk_quota": self.disk_quota, "bwrap_path": self.bwrap_path, "bwrap_version": self.bwrap_version,
            "unsafe_test_only_layers_off": testonly.honoured(self.config),
            "isolation_backend": isolation, "on_idle": on_idle,
            "usage_record_seconds": self.config.usage_record_seconds,
        }
        if egress is not None:
            spec["egress"] = await self.egress.prepare(sandbox_id, d, egress, uid, owner)
        statefile.write_json(os.path.join(d, "spec.json"), spec)
        # Until the supervisor reports, a pool sandbox must already look pooled (hidden from
        # GET /v1/sandboxes and from get), not like a user's sandbox with no state.
        handle = Handle(sandbox_id, d, image, uid, record={"state": V.POOLED if pooled else V.BOOTING})
        ready = await self._start_supervisor(handle)
        if not ready.get("ok"):
            self.egress.close(sandbox_id)
            await self._wait_for_exit(handle)
            self.live.pop(sandbox_id, None)
            self.ended.pop(sandbox_id, None)
            log.error("sandbox %s failed to start: %s (logs kept in %s)", sandbox_id, ready.get("error"), d)
            raise ApiError(503, "unavailable", f"the sandbox could not start: {ready.get('error')}")
        handle.record = ready["state"]
        return handle

    async def _start_supervisor(self, handle: Handle, *extra: str) -> dict:
        """Start a sandbox's supervisor (``--restore``: from its checkpoint) and return what
        it reported once ready (``ok``, ``state``) or why it could not start."""
        d, sandbox_id = handle.dir, handle.id
        read_fd, write_fd = os.pipe()
        log_file = open(os.path.join(d, "supervisor.log"), "ab")
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "PYTHONPATH")}
        try:
            handle.process = subprocess.Popen(
                [sys.executable, "-m", "sandbox.supervisor", d, "--ready-fd", str(write_fd), *extra],
                pass_fds=(write_fd,), stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file,
                start_new_session=True, env=env, cwd="/",
            )
        finally:
            os.close(write_fd)
            log_file.close()
        handle.pid = handle.process.pid
        self.live[sandbox_id] = handle
        line = await asyncio.to_thread(_read_line, read_fd)
        try:
            import json

            ready = json.loads(line) if line else {"ok": False, "error": "the supervisor exited during start-up"}
        except ValueError:
            ready = {"ok": False, "error": f"the supervisor said: {line[:200]!r}"}
        return ready

    # ----------------------------------------------------------- pause/resume
    async def pause(self, handle: Handle) -> dict:
        """Checkpoint a gVisor sandbox (see Supervisor.pause); its supervisor then exits."""
        if handle.record.get("state") == V.PAUSED:
            return self.describe(handle)
        await self.call(handle, {"op": "pause"}, timeout=CHECKPOINT_WAIT)
        await self._wait_for_exit(handle)
        return self.describe(handle)

    async def wake(self, handle: Handle) -> str | None:
        """Restore a paused sandbox before a call that needs it running; a note saying so
        (for the execute stream), or None when it was not paused. Callers that arrive while a
        restore is under way wait for that one."""
        if handle.record.get("state") != V.PAUSED:
            return None
        lock = self.waking.setdefault(handle.id, asyncio.Lock())
        async with lock:
            if handle.record.get("state") != V.PAUSED:
                return None
            checkpoint = handle.record.get("checkpoint") or {}
            log.info("restoring paused sandbox %s", handle.id)
            ready = await self._start_supervisor(handle, "--restore")
            if not ready.get("ok"):
                await self._wait_for_exit(handle)
                handle.record = handle.saved_record()
                if ready.get("reason") == V.RESTORE_VERSION_MISMATCH:
                    raise ApiError(409, "conflict", ready.get("error") or "version mismatch",
                                   extra={"reason": V.RESTORE_VERSION_MISMATCH})
                raise ApiError(503, "unavailable", f"the paused sandbox could not be restored: {ready.get('error')}")
            handle.record = ready["state"]
        size = checkpoint.get("size_bytes") or 0
        return (f"[sandbox: restored from its checkpoint of {size / 1e6:.1f} MB taken at {checkpoint.get('taken_at')}, "
                f"in {handle.record.get('restored_in_seconds')} s; variables kept]\n")

    async def fork(self, source: Handle, request: dict, owner: int | None = None) -> dict:
        """A second, independent sandbox restored from the source's checkpoint (see forking.py).

        A running source is paused first (the same checks as any pause: never mid-cell, never
        ``--leave-running``), then restored beside its fork; a paused one stays paused. The
        fork counts against the server's limits like a create: the source's limits, its own
        TTL and lifetime (the source's unless the request names them)."""
        spec = statefile.read_json(os.path.join(source.dir, "spec.json")) or {}
        if spec.get("isolation_backend") != V.GVISOR:
            raise ApiError(409, "conflict", "fork needs isolation 'gvisor': only a gVisor sandbox has a checkpoint "
                           "to restore twice (a bwrap sandbox's process lives on the host kernel, which cannot save "
                           "it); create the sandbox with isolation \"gvisor\"", extra={"reason": V.PAUSE_NOT_SUPPORTED})
        self._taking_new()
        limits = dict(source.record.get("limits") or spec["limits"])
        ttl = int(request.get("ttl_seconds") or source.record.get("ttl_seconds") or spec["ttl_seconds"])
        max_life = int(request.get("max_lifetime_seconds") or spec["max_lifetime_seconds"])
        capacity.check(self.config, self.host(), limits, ttl, max_life, self.usage())
        ttl = min(ttl, max_life)
        self.reserved.append(limits)
        was_running = source.record.get("state") != V.PAUSED
        try:
            try:
                fork = await self._lay_out_fork(source, was_running, request, ttl, max_life, owner)
            except ApiError:
                if was_running and source.record.get("state") == V.PAUSED:  # paused by us: back as it was
                    await asyncio.gather(self.wake(source), return_exceptions=True)
                raise
            woken = await asyncio.gather(self.wake(fork), *([self.wake(source)] if was_running else []),
                                         return_exceptions=True)
        finally:
            self.reserved.remove(limits)
        if was_running and isinstance(woken[-1], BaseException):  # it stays paused; its next call tries again
            log.warning("sandbox %s stays paused after its fork: %s", source.id, woken[-1])
        if isinstance(woken[0], BaseException):
            await self._end_paused(fork, V.DELETED, "its fork could not be restored")
            self.ended.pop(fork.id, None)
            self.tenancy.forget(fork.id)
            shutil.rmtree(fork.dir, ignore_errors=True)
            raise woken[0]
        return self.describe(fork)

    async def _lay_out_fork(self, source: Handle, was_running: bool, request: dict, ttl: int, max_life: int,
                            owner: int | None) -> Handle:
        """Pause the source if it runs and lay out its fork as a paused sandbox, holding the
        source's restore lock: nothing may restore (and write to) the source meanwhile."""
        async with self.waking.setdefault(source.id, asyncio.Lock()):
            if was_running:
                try:
                    await self.pause(source)
                except ApiError as exc:  # the pause's refusal (busy, not_running, ...), said as the fork's
                    exc.message = f"the fork needs a checkpoint of sandbox {source.id}, and {exc.message}"
                    raise
            if source.record.get("state") != V.PAUSED or self._supervisor_alive(source):
                raise ApiError(503, "unavailable", f"sandbox {source.id} did not come to rest after its checkpoint")
            fork_id = new_sandbox_id(self.config.node_id)
            d = self.state_dir.sandbox(fork_id)
            try:
                _, record = await asyncio.to_thread(forking.lay_out, source.dir, d, fork_id, ttl=ttl,
                                                    max_life=max_life, metadata=request.get("metadata"))
            except (OSError, RuntimeError) as exc:
                shutil.rmtree(d, ignore_errors=True)
                raise ApiError(503, "unavailable", f"the fork could not be laid out: {exc}") from None
        fork = Handle(fork_id, d, source.image, source.uid, record=record)
        self.live[fork_id] = fork
        self.tenancy.record(fork_id, d, owner, None)
        return fork

    async def _end_paused(self, handle: Handle, state: str, message: str) -> None:
        """End a paused sandbox: nothing runs, so its record, checkpoint and workspace go."""
        record = handle.saved_record()
        V.advance(record, state, end_message=message)
        record["ended_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        statefile.write_json(os.path.join(handle.dir, "state.json"), record)
        await asyncio.to_thread(checkpoints.discard, handle.dir)
        self.live.pop(handle.id, None)
        self.waking.pop(handle.id, None)
        self._bury(handle.id, record, handle.dir)

    def describe(self, handle: Handle) -> dict:
        record = handle.record
        out = {
            "id": handle.id,
            "state": record.get("state"),
            "image": handle.image,
            "created_at": record.get("created_at"),
            "expires_at": statefile.iso(record.get("expires_at")),
            "max_expires_at": statefile.iso(record.get("max_expires_at")),
            "ttl_seconds": record.get("ttl_seconds"),
            "execution_count": record.get("execution_count", 0),
            "executing": bool(record.get("executing")),
            "commands_running": int(record.get("commands_running") or 0),
            "limits": {k: v for k, v in (record.get("limits") or {}).items()},
            "isolation": record.get("isolation", {}),
            "from_pool": bool(record.get("from_pool", record.get("claimed", False))),
            "dead_reason": record.get("dead_reason"),
            "metadata": record.get("metadata", {}),
        }
        if record.get("forked_from"):
            out["forked_from"] = record["forked_from"]
        if "memory_bytes" in record:
            out["memory_bytes"] = record["memory_bytes"]
        egress = self.egress.describe(handle.id)
        if egress is not None:
            out["egress"] = egress
        if record.get("usage") is not None:
            out["usage"] = meter.public(record["usage"], egress)
        if (record.get("isolation") or {}).get("backend") == V.GVISOR:
            out["on_idle"] = record.get("on_idle") or V.ON_IDLE_DELETE
            out["paused_at"] = record.get("paused_at")
            out["checkpoint"] = record.get("checkpoint")
        return out

    async def refresh(self, handle: Handle) -> dict:
        if handle.record.get("state") != V.PAUSED:  # a paused one has no supervisor to ask
            try:
                await self.call(handle, {"op": "status"})
            except ApiError:
                recorded = handle.saved_record()
                if recorded.get("state") != V.PAUSED:  # it paused just now: its supervisor is leaving
                    raise
                handle.record = recorded
        return self.describe(handle)

    async def delete(self, sandbox_id: str, reason: str = "it was deleted") -> dict:
        handle = self.get(sandbox_id)  # 404/410 for unknown, ended and pooled ids
        await self.end(handle, reason)
        return {"id": sandbox_id, "state": V.DELETED}

    async def end(self, handle: Handle, reason: str) -> None:
        """Delete one sandbox, claimed or pooled, and wait until its processes are gone."""
        if handle.record.get("state") == V.PAUSED and not self._supervisor_alive(handle):
            await self._end_paused(handle, V.DELETED, reason)
            return
        try:
            await self.call(handle, {"op": "delete", "message": reason})
        except ApiError:
            pass
        await self._wait_for_exit(handle)
        if handle.id in self.live:  # the supervisor did not end: kill it and its sandbox
            self._force_kill(handle)
            await self._wait_for_exit(handle)

    def _force_kill(self, handle: Handle) -> None:
        import signal

        if handle.pid and _pid_is_supervisor(handle.pid, handle.dir):
            try:
                os.kill(handle.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------ background
    async def _reaper(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                for handle in list(self.live.values()):
                    self._check_handle(handle)
                    if handle.record.get("state") == V.PAUSED and not self._supervisor_alive(handle):
                        cap = handle.record.get("max_expires_at")
                        if cap is not None and statefile.epoch(cap) <= time.time():
                            await self._end_paused(handle, V.EXPIRED, "it reached its maximum lifetime while paused")
                self.reaping = [p for p in self.reaping if p.poll() is None]
                cutoff = time.time() - TOMBSTONE_SECONDS
                for sandbox_id in list(self.ended):
                    d = self.state_dir.sandbox(sandbox_id)
                    try:
                        if os.stat(d).st_mtime < cutoff:
                            shutil.rmtree(d, ignore_errors=True)
                            del self.ended[sandbox_id]
                            self.tenancy.forget(sandbox_id)
                    except FileNotFoundError:
                        self.ended.pop(sandbox_id, None)
                        self.tenancy.forget(sandbox_id)
            except Exception:
                log.exception("reaper pass failed")

    def pool_target(self, image: str) -> int:
        if image in self.config.pool_sizes:
            return int(self.config.pool_sizes[image])
        return self.config.pool_size if image == self.config.default_image else 0

    def _refill_soon(self) -> None:
        self._refill_event.set() if hasattr(self, "_refill_event") else None

    async def _pool_keeper(self) -> None:
        self._refill_event = asyncio.Event()
        while not self.shutting_down.is_set():
            try:
                for info in self.images.list():
                    image = info["name"]
                    queue = self.pool.setdefault(image, deque())
                    queue_live = [i for i in queue if i in self.live]
                    self.pool[image] = deque(queue_live)
                    while (len(self.pool[image]) < self.pool_target(image) and not self.shutting_down.is_set()
                           and not self.draining):
                        limits = self.config.default_limits()
                        handle = await self._spawn(image, limits, self.config.pool_idle_seconds,
                                                   self.config.pool_idle_seconds, pooled=True)
                        self.pool[image].append(handle.id)
            except ApiError as exc:
                log.warning("could not fill the warm pool: %s", exc.message)
                await asyncio.sleep(5)
            except Exception:
                log.exception("pool refill failed")
                await asyncio.sleep(5)
            self._refill_event.clear()
            try:
                await asyncio.wait_for(self._refill_event.wait(), 2.0)
            except asyncio.TimeoutError:
                pass

    def pool_status(self) -> dict:
        return {name: {"ready": len([i for i in q if i in self.live]), "target": self.pool_target(name),
                       "preload": (self.images.get(name) or {}).get("preload", [])}
                for name, q in self.pool.items()}


def _held(record: dict) -> dict:
    """What a sandbox holds of the host: all its limits, or only its disk when paused."""
    limits = record.get("limits") or {}
    if record.get("state") == V.PAUSED:
        return {"disk_mb": limits.get("disk_mb", 0)}
    return limits


def _read_line(fd: int) -> str:
    chunks = []
    with os.fdopen(fd, "rb") as f:
        line = f.readline()
        chunks.append(line)
    return b"".join(chunks).decode("utf-8", "replace").strip()
