"""The service account and the DMQ marker key of an instance.

Two secrets of an instance live in its etc/ folder, each created at the
service's first start (random, mode 0600, never logged) and read from then on:
  - service.password: the password of the service account SERVICE_ACCOUNT, the user that
    Spark links and CLI jobs (drain, dmq) log in as on the host broker instead of the
    admin; ensure_service_account() (re)creates the account in the user repository, in
    group admin, whenever the stored password no longer logs in;
  - dmq.key: the HMAC key of the marker a bridge puts on every message it dead-letters
    (jmsbridge/dmq.py), which `dmq redrive` verifies.
The service hands both to a CLI job in its admin CONFIG reply (the job logged in as an
admin) and to Spark links in their query options.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from .private import private_dir
from .props import BrokerProperties
from .users import SERVICE_ACCOUNT, UserRepository

SERVICE_GROUP = "admin"
PASSWORD_FILE = "service.password"
DMQ_KEY_FILE = "dmq.key"


def _etc(props: BrokerProperties) -> Path:
    return props.instance_dir / "etc"


def _secret(path: Path) -> str:
    """The secret in ``path``, created (32 random bytes, hex, mode 0600) when missing."""
    try:
        return path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        pass
    private_dir(path.parent)
    value = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it meanwhile: theirs counts
        return path.read_text(encoding="ascii").strip()
    with os.fdopen(fd, "w", encoding="ascii") as out:
        out.write(value + "\n")
        out.flush()
        os.fsync(out.fileno())
    return value


def service_password(props: BrokerProperties) -> str:
    return _secret(_etc(props) / PASSWORD_FILE)


def dmq_key(props: BrokerProperties) -> bytes:
    return bytes.fromhex(_secret(_etc(props) / DMQ_KEY_FILE))


def ensure_service_account(props: BrokerProperties, users: UserRepository) -> tuple[str, str]:
    """The service account's login, added to (or reset in) ``users`` when its stored
    password does not log in (first start, or someone deleted or changed it)."""
    password = service_password(props)
    if users.authenticate(SERVICE_ACCOUNT, password) is None:
        users.add(SERVICE_ACCOUNT, password, SERVICE_GROUP, replace=True)
    return SERVICE_ACCOUNT, password
