"""The gateway: one /v1 API over many node servers (``sandbox-kernel gateway``).

A node server (``sandbox-kernel serve --node-id NAME``) owns the sandboxes of its machine.
The gateway holds no sandbox of its own and no table of them: a new sandbox goes to the node
with the most free capacity (``placement``), and every later call goes to the node named in
the sandbox id (``sandbox.common.ids``), whose address the gateway knows from discovery
(``discovery``: a static list or a DNS name's A/AAAA records) and the nodes' own ``/v1/info``
(``nodes``). So replicas are interchangeable and a restarted one relearns all it needs.
Requests and answers stream through (``proxy``) with constant memory.
"""
