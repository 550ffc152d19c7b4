#!/bin/sh
# A shared host's JupyterHub with sandbox-kernel, from a checkout: run as root from the
# checkout's top (README, "Many users on one machine", has the whole recipe).
#
# Installs, under PREFIX (default /opt/sandbox-kernel, readable by every user):
#   .venv/                  sandbox-kernel, JupyterLab, JupyterHub, the idle culler (the
#                           hub, the single-user servers and the kernels run from it)
#   proxy/                  configurable-http-proxy, from npm (Debian's nodejs)
#   share/jupyter/kernels/  the kernelspecs every user gets: pinned to the system server's
#                           socket (STATE, default /var/lib/sandbox-kernel), host cells off.
#                           jupyterhub_config.py puts this directory first on the single-user
#                           servers' JUPYTER_PATH, so no same-named kernelspec (the venv's own,
#                           a user's) can stand in for them.
#   jupyterhub_config.py    the hub's configuration (a copy of this folder's)
#   hub/                    the hub's database and cookie secret (root's, 0700)
set -eu
PREFIX="${PREFIX:-/opt/sandbox-kernel}"
STATE="${STATE:-/var/lib/sandbox-kernel}"
HERE="$(cd "$(dirname "$0")" && pwd)"
SOURCE="$(cd "$HERE/../.." && pwd)"

mkdir -p "$PREFIX" && chmod 0755 "$PREFIX"
/usr/bin/python3 -m venv "$PREFIX/.venv"
"$PREFIX/.venv/bin/pip" install -q "$SOURCE[hub]"
npm install --silent --no-fund --no-audit --prefix "$PREFIX/proxy" configurable-http-proxy@5
"$PREFIX/.venv/bin/sandbox-kernel" install --prefix "$PREFIX" --url "unix:$STATE/server.sock" --no-host-cells
install -m 0644 "$HERE/jupyterhub_config.py" "$PREFIX/jupyterhub_config.py"
mkdir -p "$PREFIX/hub" && chmod 0700 "$PREFIX/hub"
