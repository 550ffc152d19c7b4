"""Sandboxes, the pool and their records: the manager (manager.py) and the parts it puts
together, one job each (registry, handles, supervisor_calls, launcher, warm_pool, admission,
pause_resume, reaper, readoption), capacity and tenancy, forks, the file airlock (files.py,
filework.py), the server's descriptors and its settings (config.py).

May import images, isolation, usage, egress, common and runtime; never the service (the
HTTP edge calls the core, not the other way).
"""
