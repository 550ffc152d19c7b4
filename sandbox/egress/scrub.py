"""A bound host's answer, with every secret value of the sandbox put back as its placeholder.

The proxy puts a secret's value into requests to its bound hosts; a host that echoes request
headers (or a debugging endpoint, or an error page) would hand the value straight back to the
sandbox. So the response's headers and body pass through a ``Scrubber`` before the sandbox sees
them:

* headers: each value with every secret value replaced;
* body: replaced as it streams, chunk by chunk, holding back the last ``longest - 1`` bytes of
  each chunk so that a value split across two chunks (or two TLS records, or two HTTP chunks)
  is still found. The body's length changes, so the proxy drops ``Content-Length`` and lets
  h11 frame the answer (chunked);
* compression: the request to a bound host asks for ``Accept-Encoding: identity``; a host that
  compresses anyway with gzip or deflate is decoded by the proxy (``Content-Encoding`` removed,
  the decoded bytes counted against the sandbox's byte budget); any other coding (br, zstd...)
  cannot be checked and is refused with 502.

Only the plain value is recognised: a host that sends it back transformed (base64, hashed,
reversed) is not scrubbed; that host can do anything with the key anyway.
"""

from __future__ import annotations

import re
import zlib

DECODABLE = {b"gzip": 31, b"x-gzip": 31, b"deflate": 15}
FRAMING = {b"content-length", b"transfer-encoding", b"content-encoding"}


class UncheckableEncoding(Exception):
    pass


class Scrubber:
    def __init__(self, replacements: dict[bytes, bytes]) -> None:
        values = sorted((v for v in replacements if v), key=len, reverse=True)
        self.replacements = replacements
        self.pattern = re.compile(b"|".join(re.escape(v) for v in values)) if values else None
        self.longest = len(values[0]) if values else 0
        self._carry = b""
        self._decoder = None

    def __bool__(self) -> bool:
        return self.pattern is not None

    def replace(self, text: bytes) -> bytes:
        return self.pattern.sub(lambda m: self.replacements[m.group()], text) if self.pattern else text

    def headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """Values scrubbed; the body's framing dropped (its length changes) after noting its
        coding: gzip and deflate are decoded here, others refused."""
        out = []
        for key, value in headers:
            name = key.lower()
            if name == b"content-encoding" and value.strip().lower() not in (b"", b"identity"):
                coding = value.strip().lower()
                if coding not in DECODABLE:
                    raise UncheckableEncoding(f"the host answered with Content-Encoding {coding.decode('latin-1')}, "
                                              "which the proxy cannot check for secret values; refused")
                self._decoder = zlib.decompressobj(DECODABLE[coding])
            if name in FRAMING:
                continue
            out.append((key, self.replace(value)))
        return out

    def feed(self, data: bytes) -> bytes:
        if self._decoder is not None:
            data = self._decoder.decompress(data)
        buffer = self._carry + data
        keep = len(buffer) - (self.longest - 1)
        out, position = [], 0
        for match in self.pattern.finditer(buffer):
            if match.start() >= keep:
                break
            out += [buffer[position:match.start()], self.replacements[match.group()]]
            position = match.end()
        cut = max(position, keep)
        out.append(buffer[position:cut])
        self._carry = buffer[cut:]
        return b"".join(out)

    def flush(self) -> bytes:
        if self._decoder is not None:
            self._carry += self._decoder.flush()
        rest, self._carry = self._carry, b""
        return self.replace(rest)
