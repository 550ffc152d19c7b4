"""The server's file descriptors: its limit, the reserve it keeps for itself, and the error
that names them when they run out.

Every sandbox can make the server open descriptors (egress connections above all). Without a
reserve, one sandbox that opens enough of them makes every ``open()`` of the server fail, for
everyone: creates, file listings, state files. So the server raises its soft limit to the hard
one at start, keeps ``reserve`` descriptors that no sandbox-driven work may take, and says
``out_of_descriptors`` (503) when something does run out, rather than whatever the failing
``open()`` happened to be mistaken for.
"""

from __future__ import annotations

import errno
import os
import resource
import time

from ..common.errors import ApiError

EXHAUSTED = (errno.EMFILE, errno.ENFILE)
MIN_RESERVE = 256


def raise_soft_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard one (what the operator allows); the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft


def soft_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def default_reserve(limit: int) -> int:
    """A quarter of the limit, at least MIN_RESERVE: room for every sandbox's supervisor
    channels, state files and API requests whatever the egress proxy holds."""
    return max(MIN_RESERVE, limit // 4)


def open_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def is_exhausted(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in EXHAUSTED


def exhausted_error(exc: OSError | None = None) -> ApiError:
    what = "the host's file table (ENFILE)" if exc is not None and exc.errno == errno.ENFILE else \
        f"its file descriptors (EMFILE, limit {soft_limit()})"
    return ApiError(503, "out_of_descriptors", f"the sandbox server ran out of {what}; nothing was changed, "
                    "retry later (the egress proxy's connections of the sandbox that used them end with it)")


class DescriptorBudget:
    """What sandbox-driven work may still open: the soft limit less the reserve, checked against
    the real count of open descriptors (sampled at most every ``every`` seconds, plus what was
    taken since through this budget)."""

    def __init__(self, reserve: int = 0, every: float = 0.5) -> None:
        self.limit = soft_limit()
        self.reserve = reserve or default_reserve(self.limit)
        self.every = every
        self._sampled_at = 0.0
        self._count = 0

    def room(self, taking: int = 1) -> bool:
        """Whether ``taking`` more descriptors leave the reserve whole."""
        now = time.monotonic()
        if now - self._sampled_at > self.every:
            self._count, self._sampled_at = open_count(), now
        if self._count + taking > self.limit - self.reserve:
            return False
        self._count += taking
        return True

    def describe(self) -> dict:
        return {"limit": self.limit, "reserve": self.reserve}
