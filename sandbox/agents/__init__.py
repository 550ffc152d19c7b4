"""Agent frameworks over the same stateful sandboxes.

- ``transcript``: what an agent is shown of one run (text, real errors, figures), shared by
  every integration so that ADK, MCP and a hand-written tool loop see a run the same way.
- ``adk``: an ADK code executor and ADK function tools (``pip install 'sandbox-kernel[adk]'``).
- ``mcp_server``: ``sandbox-kernel mcp``, a Model Context Protocol server
  (``pip install 'sandbox-kernel[mcp]'``).

Each integration imports its framework on import, so importing this package needs neither.
"""
