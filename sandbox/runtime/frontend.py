"""What code in a sandbox asks of the notebook's frontend: answers to input(), and comms.

There is no Jupyter kernel inside a sandbox, only IPython. These stand in for the parts of
ipykernel that user code and libraries reach for, the way ipykernel provides them:

- ``input()``, ``getpass.getpass()`` (and so ``breakpoint()``'s pdb prompt, which reads
  with ``input``) send an ``input_request`` event and wait for the answer the host hands
  in (``OP_INPUT_REPLY``); when the request did not allow stdin they raise the error
  ipykernel raises (``StdinNotImplementedError``). An interrupt ends the wait.
- comms (ipywidgets, tqdm.notebook): ``comm.create_comm`` makes a comm whose messages are
  events of the running execute; the frontend's messages arrive as ``OP_COMM`` requests
  and go to the comm manager ipywidgets registered its targets with.
- ``get_ipython().kernel.get_parent()``: the id of the frontend's request being handled,
  which ipywidgets' ``Output`` widget captures output by.

Standard library only at import (``comm`` is imported if the image has it).
"""

from __future__ import annotations

import base64
import builtins
import getpass
import queue

from . import vocabulary as V
from .display import clean_metadata

STDIN_DISABLED = "raw_input was called, but this frontend does not support input requests."


class InputChannel:
    """input() and getpass() for the cell that is running, answered by the frontend."""

    def __init__(self, runtime):
        self.runtime = runtime
        self.allowed = False  # set per request: the execute's allow_stdin
        self.answers: queue.Queue = queue.Queue()

    def install(self) -> None:
        builtins.input = self.input
        getpass.getpass = self.getpass

    def input(self, prompt: object = "") -> str:
        return self.ask(str(prompt), password=False)

    def getpass(self, prompt: str = "Password: ", stream=None) -> str:
        return self.ask(str(prompt), password=True)

    def ask(self, prompt: str, password: bool) -> str:
        if not self.allowed:
            from IPython.core.error import StdinNotImplementedError

            raise StdinNotImplementedError(STDIN_DISABLED)
        exec_id = self.runtime.current
        while True:  # an answer left over from an earlier prompt is not this one's
            try:
                self.answers.get_nowait()
            except queue.Empty:
                break
        self.runtime.sync_streams()
        self.runtime.send({"type": V.INPUT_REQUEST, "exec": exec_id,
                           "prompt": prompt[:V.PROMPT_MAX_CHARS], "password": bool(password)})
        while True:
            try:  # a timeout, so that the interrupt's KeyboardInterrupt is raised here
                answered, value = self.answers.get(timeout=0.5)
            except queue.Empty:
                continue
            if answered == exec_id:
                if value == "\x04":  # the frontend's end of input, as ipykernel reads it
                    raise EOFError
                return value

    def answer(self, message: dict) -> None:
        """Called on the reader thread with the frontend's answer."""
        self.answers.put((message.get("exec"), str(message.get("value", ""))[:V.INPUT_MAX_CHARS]))


class KernelStandIn:
    """``get_ipython().kernel`` as ipywidgets looks at it: the parent request's id."""

    def __init__(self, runtime):
        self.runtime = runtime

    def get_parent(self, channel: str = "shell") -> dict:
        msg_id = self.runtime.parent_msg_id
        return {"header": {"msg_id": msg_id, "msg_type": "execute_request"}} if msg_id else {}


def install_comms(runtime):
    """Make ``comm.create_comm`` and ``comm.get_comm_manager`` ours; None if the image has
    no ``comm`` package (then no comm can be made, and incoming ones are refused)."""
    try:
        import comm
        from comm.base_comm import BaseComm, CommManager
    except ImportError:
        return None

    class SandboxComm(BaseComm):
        def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
            event = {"type": msg_type, "exec": runtime.current, "comm_id": str(self.comm_id)[:V.NAME_MAX_CHARS],
                     "data": clean_metadata(data or {})[0], "metadata": clean_metadata(metadata or {})[0]}
            if buffers:
                event["buffers"] = [base64.b64encode(bytes(b)).decode("ascii")
                                    for b in buffers[:V.COMM_BUFFERS_MAX]]
            if msg_type == V.COMM_OPEN:
                event["target_name"] = str(keys.get("target_name") or "")[:V.NAME_MAX_CHARS]
                module = keys.get("target_module")
                event["target_module"] = str(module)[:V.NAME_MAX_CHARS] if module else None
            runtime.publish_comm(event)

    manager = CommManager()
    comm.create_comm = SandboxComm
    comm.get_comm_manager = lambda: manager
    return manager


def comm_message(request: dict) -> dict:
    """The Jupyter message a comm manager's handlers expect, from an ``OP_COMM`` request."""
    content = {"comm_id": request.get("comm_id"), "data": request.get("data") or {}}
    if request.get("target_name") is not None:
        content["target_name"] = request["target_name"]
    return {"header": {"msg_id": request.get("msg_id") or "", "msg_type": request.get("msg_type")},
            "parent_header": {}, "metadata": request.get("metadata") or {}, "content": content,
            "buffers": [base64.b64decode(b) for b in request.get("buffers") or []]}
