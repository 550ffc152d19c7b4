"""Isolation backends. bubblewrap (``bwrap``) is the embedded default; cgroups, rlimits and
seccomp are the resource and syscall layers it is combined with."""
