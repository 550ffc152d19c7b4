"""A scripted stand-in for a language model, for ADK agents in tests and notebook 05.

No model is reachable here, so the model of these agents is a `BaseLlm` subclass that
replays a script: each reply is either text (a code block for ADK's code executor, or a
final answer) or a function call. A reply may be a function of the last tool output the
agent fed back, so that an answer quotes what the sandbox actually computed: a sandbox
that computed something else makes a different answer, which the host check then rejects.
"""

from __future__ import annotations

import re
import typing as t

from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.genai import types

TOOL_OUTPUT_RE = re.compile(r"```tool_output\n(.*?)\n```", re.DOTALL)

Reply = t.Union[str, types.FunctionCall, t.Callable[[str], t.Union[str, types.FunctionCall]]]


def last_tool_output(request: LlmRequest) -> str:
    """The most recent code-execution output or function response in the conversation."""
    for content in reversed(request.contents or []):
        for part in reversed(content.parts or []):
            if part.function_response is not None:
                return str(part.function_response.response)
            if part.text:
                found = TOOL_OUTPUT_RE.findall(part.text)
                if found:
                    return found[-1]
    return ""


class ScriptedModel(BaseLlm):
    """Scripted stand-in for a model (no model is reachable here): replays `replies` in order."""

    replies: list[t.Any]
    requests: list[LlmRequest] = []

    async def generate_content_async(self, llm_request: LlmRequest, stream: bool = False) -> t.AsyncGenerator[LlmResponse, None]:
        self.requests.append(llm_request)
        if not self.replies:
            raise AssertionError("the scripted model ran out of replies")
        reply = self.replies.pop(0)
        if callable(reply) and not isinstance(reply, types.FunctionCall):
            reply = reply(last_tool_output(llm_request))
        if isinstance(reply, types.FunctionCall):
            part = types.Part(function_call=reply)
        else:
            part = types.Part(text=reply)
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def code(source: str) -> str:
    """A model reply that asks ADK's code executor to run `source`."""
    return f"```python\n{source}\n```"
