"""The one error type the API speaks: an HTTP status, a machine code and a human message."""

from __future__ import annotations


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or {}

    def body(self) -> dict:
        return {"error": {"code": self.code, "message": self.message, **self.extra}}
