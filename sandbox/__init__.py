"""sandbox-kernel's service side: stateful Python sandboxes behind an HTTP API.

Agents use the client directly::

    from sandbox import Sandbox
    with Sandbox.create() as sbx:
        print(sbx.run_code("1 + 1").results)
"""

__version__ = "0.1.0"


def __getattr__(name):
    # The client pulls in httpx; keep `import sandbox` cheap for the supervisor.
    if name in {"Sandbox", "AsyncSandbox", "Execution", "CommandResult", "SandboxError", "SandboxGone", "SandboxNotFound",
                "Unauthorized", "InvalidRequest", "ServerUnavailable", "list_sandboxes"}:
        from . import client

        return getattr(client, name)
    raise AttributeError(name)
