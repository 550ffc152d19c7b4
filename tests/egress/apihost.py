"""A stand-in for "an API host": real HTTP and HTTPS servers on a loopback address, with a
certificate of their own (a test CA for the names api.test and other.test), that record
the headers of every request they get."""

from __future__ import annotations

import contextlib
import datetime
import gzip
import http.server
import json
import pathlib
import ssl
import threading

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
import pytest
from cryptography.x509.oid import NameOID

import support

NAMES = ("api.test", "other.test")


def make_test_ca(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """(CA certificate, server certificate+key) for NAMES, written into ``directory``."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "egress test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAMES[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in NAMES]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    ca_path, server_path = directory / "test-ca.pem", directory / "api-host.pem"
    ca_path.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return ca_path, server_path


class ApiHost:
    """One HTTPS and one plain HTTP server on 127.0.0.1, both recording what they get."""

    def __init__(self, directory: pathlib.Path) -> None:
        self.ca_path, cert_path = make_test_ca(directory)
        self.seen: list[dict] = []
        seen = self.seen

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                seen.append({"method": self.command, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                             "body": body.decode("latin-1")})
                if self.path.startswith("/reflect"):
                    return self._reflect()
                out = json.dumps({"ok": True, "path": self.path}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def _reflect(self) -> None:
                """A host that hands the request's Authorization header back: in a header and in
                the body, the body plain, gzip, in 3-byte HTTP chunks, or in a coding the proxy
                cannot read (brotli, by name)."""
                secret = (self.headers.get("authorization") or "").encode()
                body = b"you sent: " + secret + b"\n"
                self.send_response(200)
                self.send_header("x-you-sent", secret.decode())
                if self.path == "/reflect/gzip":
                    body = gzip.compress(body)
                    self.send_header("content-encoding", "gzip")
                if self.path == "/reflect/br":
                    self.send_header("content-encoding", "br")
                if self.path == "/reflect/chunked":
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    for i in range(0, len(body), 3):
                        piece = body[i:i + 3]
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    self.wfile.write(b"0\r\n\r\n")
                    return
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:
                pass

        self.https = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert_path)
        self.https.socket = context.wrap_socket(self.https.socket, server_side=True)
        self.http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.https_port = self.https.server_address[1]
        self.http_port = self.http.server_address[1]
        for server in (self.https, self.http):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    def close(self) -> None:
        for server in (self.https, self.http):
            server.shutdown()
            server.server_close()

    def __enter__(self) -> "ApiHost":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def egress_server(image_source: pathlib.Path, api: ApiHost, hosts: dict[str, str]):
    """A server of the test's own whose egress proxy maps ``hosts`` (test names to loopback)
    and trusts the test host's CA."""
    own = support.own_server(image_source, "--set", f"egress_hosts={hosts!r}",
                             "--set", f"egress_ca_file={api.ca_path}")
    own.open()
    try:
        yield own
    finally:
        own.close()


@pytest.fixture(scope="module")
def api_host(tmp_path_factory):
    """The module's API host (import this fixture into a test module to use it)."""
    with ApiHost(tmp_path_factory.mktemp("api-host")) as host:
        yield host
