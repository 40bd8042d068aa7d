"""imqbridgemgr keytool: a private key and a self-signed certificate for a TLS port.

The chapter's "create a keystore with imqkeytool before enabling TLS" step, in PEM files the
TLS ports read (their .tls.certfile / .tls.keyfile properties). One private key (EC P-256,
or RSA 3072) and a self-signed certificate for it: subject CN the host name, subjectAltName
that name plus localhost, 127.0.0.1 and ::1 and any names asked for, serverAuth only, not a
CA. The key is written through private.open_private (0600, whatever the umask); the
certificate, which is public, 0644. Files that exist are kept unless the caller says to
replace them.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from .private import open_private, private_dir
from .props import BrokerProperties

# The services with a TLS port, and the prefix of their .tls.* properties.
TLS_SERVICES = {
    "stomp": "imq.bridge.stomp.tls",
    "jms": "imq.jms.tls",
    "admin": "imq.bridge.admin.tls",
    "metrics": "imq.metrics.tls",
}
KEY_ALGORITHMS = ("EC", "RSA")
RSA_BITS = 3072
CERT_MODE = 0o644


class KeytoolError(Exception):
    """The key or certificate cannot be written (a file exists, a folder is not writable)."""


@dataclass(frozen=True)
class KeyRequest:
    """What to make: for which service, for which names, where, and for how long."""

    service: str
    common_name: str
    alt_names: tuple[str, ...] = ()
    validity_days: int = 365
    key_algorithm: str = "EC"
    certfile: Path | None = None  # None: <instance>/etc/<service>-cert.pem
    keyfile: Path | None = None  # None: <instance>/etc/<service>-key.pem
    replace: bool = False


@dataclass(frozen=True)
class KeyPair:
    """What was written, and the properties that make the service use it."""

    certfile: Path
    keyfile: Path
    fingerprint: str  # SHA-256 of the certificate (DER), hex pairs with colons
    not_after: datetime.datetime
    properties: dict[str, str]


def default_common_name(props: BrokerProperties, service: str) -> str:
    """The host the service listens on (its hostname property), else this machine's name."""
    named = props.stomp.hostname if service == "stomp" else props.get("imq.hostname")
    return named or socket.getfqdn()


def make_key_pair(props: BrokerProperties, request: KeyRequest) -> KeyPair:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if request.service not in TLS_SERVICES:
        raise KeytoolError(f"no TLS service {request.service!r}; name one of {', '.join(TLS_SERVICES)}")
    if request.validity_days < 1:
        raise KeytoolError(f"the validity must be at least 1 day, not {request.validity_days}")
    etc = props.instance_dir / "etc"
    certfile = (request.certfile or etc / f"{request.service}-cert.pem").absolute()
    keyfile = (request.keyfile or etc / f"{request.service}-key.pem").absolute()
    if certfile == keyfile:
        raise KeytoolError(f"the certificate and the key need two files, not both {certfile}")
    if not request.replace:
        for path in (certfile, keyfile):
            if path.exists():
                raise KeytoolError(f"{path} exists; -f replaces it")

    if request.key_algorithm == "RSA":
        key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey = rsa.generate_private_key(65537, RSA_BITS)
    elif request.key_algorithm == "EC":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        raise KeytoolError(f"no key algorithm {request.key_algorithm!r}; name one of {', '.join(KEY_ALGORITHMS)}")
    names: list[x509.GeneralName] = []
    for name in dict.fromkeys((request.common_name, "localhost", "127.0.0.1", "::1", *request.alt_names)):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            names.append(x509.DNSName(name))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, request.common_name)])
    now = datetime.datetime.now(datetime.UTC)
    not_after = now + datetime.timedelta(days=request.validity_days)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # clocks a little behind
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_encipherment=request.key_algorithm == "RSA",
                content_commitment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )

    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    try:
        for path in (certfile, keyfile):
            private_dir(path.parent)  # missing folders are made 0700
        _write(keyfile, key_pem, None, request.replace)
        _write(certfile, cert_pem, CERT_MODE, request.replace)
    except FileExistsError as exc:  # made since the check above
        raise KeytoolError(f"{exc.filename} exists; -f replaces it") from None
    except OSError as exc:
        raise KeytoolError(f"cannot write {exc.filename or 'the files'}: {exc.strerror}") from None
    prefix = TLS_SERVICES[request.service]
    digest = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest().upper()
    return KeyPair(
        certfile,
        keyfile,
        ":".join(digest[i : i + 2] for i in range(0, len(digest), 2)),
        not_after,
        {f"{prefix}.enabled": "true", f"{prefix}.certfile": str(certfile), f"{prefix}.keyfile": str(keyfile)},
    )


def _write(path: Path, data: bytes, mode: int | None, replace: bool) -> None:
    """``data`` into a new ``path`` (or the existing one replaced); ``mode`` None: a
    private file (0600)."""
    flags = os.O_WRONLY | (os.O_TRUNC if replace else os.O_EXCL)
    fd = open_private(path, flags) if mode is None else os.open(path, flags | os.O_CREAT, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
