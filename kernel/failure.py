"""The one way a cell fails without a traceback: `CellFailure(ename, evalue)`."""

from __future__ import annotations


class CellFailure(Exception):
    """The cell cannot go on, for a reason the user can read and often fix: a magic's bad
    argument, a path the airlock refuses, a sandbox gone twice in a row, a server that
    stays away. The kernel shows it as `ename: evalue` with no traceback, because that
    traceback would be of the kernel's code, not the user's."""

    def __init__(self, ename: str, evalue: str) -> None:
        super().__init__(evalue)
        self.ename = ename
        self.evalue = evalue
