"""The sandbox's memory limit told to the language runtimes that size themselves from the
machine: the JVM and Node.js.

A JVM picks its largest heap as a quarter of the memory it believes it has: the cgroup's
limit where a cgroup filesystem is mounted, else ``/proc/meminfo``. A sandbox shows it
neither (bubblewrap mounts no cgroup filesystem; gVisor's ``/proc/meminfo`` is the host's),
so on a 23 GiB host every JVM of a 1 GiB sandbox planned a 6 GiB heap: a program that
filled it was killed by the out-of-memory killer (on gVisor the whole sandbox with it)
instead of getting Java's ``OutOfMemoryError``. Where no memory cgroup is given and the limit
is an address-space rlimit (the limit plus 2 GiB, isolation/host.py), no JVM started at all
("Could not allocate compressed class space"). ``-XX:MaxRAM`` gives the JVM the sandbox's
limit, so that its heap is a quarter of it as in any container (tests/images/test_java_image.py).

``JAVA_TOOL_OPTIONS`` reaches every JVM (``java``, ``javac``, ``jshell``, build tools); the JVM
says so on stderr ("Picked up JAVA_TOOL_OPTIONS: ..."), the price of a setting no program
has to pass. A sandbox claimed from a pool keeps the pool's value (its environment is
fixed at start).

Node.js's V8 does the same with its old-generation heap (about 4 GiB on this 23 GiB host,
against a 1 GiB sandbox): a script that kept growing was killed by the out-of-memory killer,
on gVisor with its whole sandbox, before V8's own "JavaScript heap out of memory". Its
``--max-old-space-size`` in ``NODE_OPTIONS`` (which every ``node`` reads, npm's too) caps it
at half the sandbox's limit: V8's young generation, code and buffers live outside it, and
Python and the sandbox's other processes share the rest. A program that asks for more still
gets it with its own ``--max-old-space-size`` on the command line (the last one wins).
"""

from __future__ import annotations


def runtime_environment(limits: dict) -> dict[str, str]:
    """The variables that tell the runtimes the sandbox's memory limit (none without one)."""
    memory_mb = limits.get("memory_mb")
    if not memory_mb:
        return {}
    return {"JAVA_TOOL_OPTIONS": f"-XX:MaxRAM={int(memory_mb)}m",
            "NODE_OPTIONS": f"--max-old-space-size={max(int(memory_mb) // 2, 16)}"}
