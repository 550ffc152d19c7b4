"""JupyterHub for a team on one host, every notebook in a sandbox of the system server.

setup.sh copies this file into PREFIX (default /opt/sandbox-kernel) beside what it
installed; everything here is found from where this file is. What each setting is for:

- PAM logins (the hub runs as root): the members of one Unix group (TEAM_GROUP below) log
  in with their own account's password, and each single-user server runs as that account
  (LocalProcessSpawner).
- The kernelspecs setup.sh installed, first on every single-user server's JUPYTER_PATH:
  they point at the system server (`serve --multi-user`), so a same-named kernelspec that
  pip put in the venv cannot make a user's kernels start a weak private server of their own.
  Only those are offered (no host "Python 3" kernel), and the gVisor one only where runsc is.
- Homes 0700 before each spawn: Debian makes them 0755, and a team's notebooks are not
  every member's to read.
- The idle culler stops a single-user server idle for an hour; a notebook keeps its
  sandbox through that, as through a server stop or a hub restart.
"""

import os
import pathlib
import pwd
import shutil
import stat
import sys

PREFIX = pathlib.Path(__file__).resolve().parent
VENV_BIN = PREFIX / ".venv" / "bin"
# The Unix group whose members may log in (groupadd jupyterhub-users; usermod -aG ...).
TEAM_GROUP = os.environ.get("SANDBOX_KERNEL_HUB_GROUP", "jupyterhub-users")
# How long a single-user server may sit idle before the culler stops it (it looks every half
# of that); tests/multiuser/test_jupyterhub.py shortens it to see a real cull.
IDLE_CULL_SECONDS = int(os.environ.get("SANDBOX_KERNEL_HUB_CULL_SECONDS", "3600"))

c = get_config()  # noqa: F821 (JupyterHub's config loader provides it)

c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {TEAM_GROUP}
c.JupyterHub.spawner_class = "localprocess"
c.JupyterHub.db_url = f"sqlite:///{PREFIX / 'hub' / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(PREFIX / "hub" / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.command = [str(PREFIX / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(PREFIX / "hub" / "jupyterhub-proxy.pid")

KERNELSPECS = ["sandbox"] + (["sandbox-gvisor"] if shutil.which("runsc") else [])
c.Spawner.cmd = [str(VENV_BIN / "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.environment = {"JUPYTER_PATH": str(PREFIX / "share" / "jupyter")}
c.Spawner.args = ["--KernelSpecManager.ensure_native_kernel=False",
                  *(f"--KernelSpecManager.allowed_kernelspecs={name}" for name in KERNELSPECS)]


def private_home(spawner) -> None:
    """The user's home 0700 (only ever narrowed, and only a home the user owns)."""
    entry = pwd.getpwnam(spawner.user.name)
    home = pathlib.Path(entry.pw_dir)
    info = home.stat()
    if stat.S_ISDIR(info.st_mode) and info.st_uid == entry.pw_uid and info.st_mode & 0o077:
        home.chmod(stat.S_IMODE(info.st_mode) & 0o700)


c.Spawner.pre_spawn_hook = private_home

c.JupyterHub.services = [{
    "name": "idle-culler",
    "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={IDLE_CULL_SECONDS}"],
}]
c.JupyterHub.load_roles = [{
    "name": "idle-culler",
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
    "services": ["idle-culler"],
}]
