"""The per-server certificate authority that lets the proxy read requests to secret-bound hosts.

Putting a secret into a request's headers means reading the request, which for HTTPS means
terminating TLS: the proxy presents a certificate for the bound host, signed by this CA, and
the sandboxes of this server trust it (their CA bundle is the host's plus this one). The key
stays in the server's state directory (0600), which no sandbox can see; every server makes
its own, so one server's CA means nothing to another's sandboxes.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
import os
import ssl

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write_private(path: str, data: bytes) -> None:
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


class CertificateAuthority:
    def __init__(self, directory: str) -> None:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.directory = directory
        self.cert_path = os.path.join(directory, "ca.pem")
        self.key_path = os.path.join(directory, "ca-key.pem")
        self.bundle_path = os.path.join(directory, "sandbox-ca-bundle.pem")
        if not (os.path.exists(self.cert_path) and os.path.exists(self.key_path)):
            self._create()
        with open(self.key_path, "rb") as f:
            self._key = serialization.load_pem_private_key(f.read(), None)
        with open(self.cert_path, "rb") as f:
            self._cert = x509.load_pem_x509_certificate(f.read())
        self._write_bundle()

    def _create(self) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sandbox-kernel egress CA")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=3650))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        _write_private(self.key_path, _pem_key(key))
        with open(self.cert_path, "wb") as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))

    def _write_bundle(self) -> None:
        """The host's trusted roots plus this CA: what a sandbox with egress trusts."""
        system = b""
        if os.path.exists(SYSTEM_BUNDLE):
            with open(SYSTEM_BUNDLE, "rb") as f:
                system = f.read()
        with open(self.cert_path, "rb") as f:
            ours = f.read()
        with open(self.bundle_path + ".tmp", "wb") as f:
            f.write(system.rstrip(b"\n") + b"\n" + ours)
        os.chmod(self.bundle_path + ".tmp", 0o644)
        os.replace(self.bundle_path + ".tmp", self.bundle_path)

    @functools.lru_cache(maxsize=256)
    def server_context(self, host: str) -> ssl.SSLContext:
        """A TLS server context presenting a certificate for ``host``, HTTP/1.1 only (ALPN):
        the proxy reads requests with an HTTP/1.1 parser, so HTTP/2 is never negotiated."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        try:
            san = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
                .issuer_name(self._cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
                .add_extension(x509.SubjectAlternativeName([san]), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .sign(self._key, hashes.SHA256()))
        leaf_dir = os.path.join(self.directory, "leaf")
        os.makedirs(leaf_dir, mode=0o700, exist_ok=True)
        path = os.path.join(leaf_dir, host.replace("/", "_") + ".pem")
        _write_private(path, cert.public_bytes(serialization.Encoding.PEM) + _pem_key(key))
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(path)
        context.set_alpn_protocols(["http/1.1"])
        return context
