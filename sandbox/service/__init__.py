"""The HTTP edge: the routes and their route table (api.py), request validation (schemas.py,
commands.py), the OpenAPI document (openapi.py), who is calling (auth.py, scopes.py),
starting the server (server.py), where it listens (endpoint.py), running it as a child
(server_process.py), its idle stop (idle.py), its state directory's housekeeping
(housekeeping.py) and a node's identity proof (nodeproof.py).

May import every layer below it (core, images, isolation, usage, egress, common, runtime);
nothing below imports it.
"""
