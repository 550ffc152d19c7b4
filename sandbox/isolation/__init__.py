"""How a sandbox is walled in on this host: bubblewrap (``bwrap``, the embedded default) and
gVisor's ``runsc`` (bwrap.py, gvisor.py, rootfs.py), combined with cgroups (cgroups.py),
seccomp (seccomp.py) and a capped workspace (disk.py); the backends that spawn the runtime
with them (backends/); a paused gVisor sandbox's checkpoint (checkpoints.py); what protects
a sandbox here (doctor.py) and the guarded test-only switch that sets a layer aside
(testonly.py).

May import images, common and runtime; never the core, the supervisor or the service.
"""
