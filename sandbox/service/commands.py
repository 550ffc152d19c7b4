"""A command request: what `POST /v1/sandboxes/{id}/commands` accepts, checked and put in
the one form the supervisor forwards to the sandbox's runtime.

The field declarations (types, sizes) live in schemas.COMMAND with every other route's;
this module adds what one field cannot say alone: exactly one of ``argv`` and ``shell``,
at most one of ``stdin`` and ``stdin_base64``, environment names and values a process can
take, and a working directory inside ``/workspace``. The directory rule is about the API's
contract, not a wall: a command may ``cd`` anywhere the sandbox lets it.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re

from ..common.errors import ApiError

WORKSPACE = "/workspace"
SHELL = ("/bin/sh", "-c")
ENV_NAME = r"[A-Za-z_][A-Za-z0-9_]{0,127}"
MAX_ENV = 256
MAX_ENV_VALUE = 32 * 1024
MAX_STDIN = 1024 * 1024
MAX_STDIN_BASE64 = (MAX_STDIN + 2) // 3 * 4


def _invalid(message: str) -> ApiError:
    return ApiError(422, "invalid_request", message)


def _no_nul(name: str, value: str) -> str:
    if "\0" in value:
        raise _invalid(f"{name} contains a NUL character, which no program argument can hold")
    return value


def working_directory(cwd: str | None) -> str:
    """``cwd`` as an absolute path inside /workspace (relative paths are taken from there)."""
    if cwd is None or cwd == "":
        return WORKSPACE
    _no_nul("cwd", cwd)
    path = posixpath.normpath(posixpath.join(WORKSPACE, cwd))
    if path != WORKSPACE and not path.startswith(WORKSPACE + "/"):
        raise _invalid(f"cwd {cwd!r} is outside /workspace; give a path relative to /workspace or under it")
    return path


def environment(env: dict | None) -> dict[str, str]:
    env = env or {}
    if len(env) > MAX_ENV:
        raise _invalid(f"env has {len(env)} variables; at most {MAX_ENV} may be set")
    out = {}
    for name, value in env.items():
        if not re.fullmatch(ENV_NAME, name):
            raise _invalid(f"env name {name[:64]!r} is not a valid variable name (letters, digits and _, "
                           "not starting with a digit, at most 128 characters)")
        if not isinstance(value, str):
            raise _invalid(f"env value of {name} must be a string, got {type(value).__name__}")
        if len(value) > MAX_ENV_VALUE:
            raise _invalid(f"env value of {name} is longer than {MAX_ENV_VALUE} characters")
        out[name] = _no_nul(f"env value of {name}", value)
    return out


def standard_input(data: dict) -> str | None:
    """stdin as base64 (the frame to the runtime is JSON), or None for no input at all."""
    if data.get("stdin") is not None and data.get("stdin_base64") is not None:
        raise _invalid("give stdin (text) or stdin_base64 (bytes), not both")
    if data.get("stdin") is not None:
        raw = data["stdin"].encode("utf-8", "surrogatepass")
    elif data.get("stdin_base64") is not None:
        try:
            raw = base64.b64decode(data["stdin_base64"], validate=True)
        except (binascii.Error, ValueError):
            raise _invalid("stdin_base64 is not valid base64") from None
    else:
        return None
    if len(raw) > MAX_STDIN:
        raise _invalid(f"stdin is {len(raw)} bytes; at most {MAX_STDIN} may be sent inline "
                       "(upload a file and redirect it instead)")
    return base64.b64encode(raw).decode("ascii")


def prepare(data: dict) -> dict:
    """The supervisor's request for a parsed body (see schemas.COMMAND)."""
    if (data.get("argv") is None) == (data.get("shell") is None):
        raise _invalid("give exactly one of argv (a list of arguments) and shell (a string for /bin/sh -c)")
    if data.get("argv") is not None:
        argv = [_no_nul("argv", arg) for arg in data["argv"]]
        if not argv or not argv[0]:
            raise _invalid("argv must name a program: its first item may not be empty")
    else:
        argv = [*SHELL, _no_nul("shell", data["shell"])]
    request = {"argv": argv, "cwd": working_directory(data.get("cwd")), "env": environment(data.get("env")),
               "stdin": standard_input(data)}
    if data.get("shell") is not None:
        request["shell"] = data["shell"]
    if data.get("timeout_seconds") is not None:
        request["timeout_seconds"] = data["timeout_seconds"]
    return request
