"""The user repository: who may log in to the STOMP bridge (and later every client).

The user repository is a text file, one user a line,
    name:group:scrypt$<log2 N>$<r>$<p>$<salt hex>$<hash hex>
with '#' comments. Passwords are kept only as salted scrypt hashes (hashlib, stdlib);
checking one costs tens of milliseconds on purpose, so network services call
authenticate() off their event loop. A successful check is remembered as an HMAC of the
name and password under a key that lives only in this process (never the password), so
a client reconnecting with the same credentials does not pay the hash again; any change
to the file (mtime, size) forgets everything.

Edits (add, delete) take an exclusive flock on "<file>.lock", re-read the file, and replace
it atomically (write a temporary file, fsync, rename) with mode 0600.
"""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .private import open_private, open_private_text, private_dir
from .props import BrokerProperties

GROUPS = ("admin", "user")
SERVICE_ACCOUNT = "imqbridge-service"  # the bridge service's own login (servicekeys.py)
HEADER = "# imqbridge user repository: name:group:scrypt$logN$r$p$salt$hash (edit with imqbridgemgr user)\n"
SCRYPT_LOG_N, SCRYPT_R, SCRYPT_P = 14, 8, 1  # 16 MiB, ~40 ms per check
_MAX_MEM = 64 * 1024 * 1024


class UserRepositoryError(Exception):
    """The repository file cannot be read or written, or an edit is not allowed."""


@dataclass(frozen=True)
class User:
    name: str
    group: str


@dataclass(frozen=True)
class _Entry:
    user: User
    password_hash: str


def hash_password(password: str, *, log_n: int = SCRYPT_LOG_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """A new salted scrypt hash of ``password`` in the repository's text form."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, n=2**log_n, r=r, p=p, maxmem=_MAX_MEM, dklen=32)
    return f"scrypt${log_n}${r}${p}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    """Does ``password`` match the stored hash? False for any malformed hash."""
    try:
        scheme, log_n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = bytes.fromhex(digest)
        got = hashlib.scrypt(
            password.encode("utf-8"),
            salt=bytes.fromhex(salt),
            n=2 ** int(log_n),
            r=int(r),
            p=int(p),
            maxmem=_MAX_MEM,
            dklen=len(expected),
        )
    except (ValueError, MemoryError):
        return False
    return hmac.compare_digest(got, expected)


def check_name(name: str) -> None:
    if not name or name != name.strip() or any(c in name for c in ":\n\r#") or len(name) > 256:
        raise UserRepositoryError(
            f"{name!r} is not a usable user name: use 1 to 256 characters "
            "without ':', '#', line breaks or surrounding spaces"
        )


def default_path(props: BrokerProperties) -> Path:
    """imq.user_repository.file, else <var>/instances/<instance>/etc/passwd."""
    configured = props.get("imq.user_repository.file")
    return Path(configured) if configured else props.instance_dir / "etc" / "passwd"


def open_repository(props: BrokerProperties) -> UserRepository:
    """The service's repository; a fresh (empty) one gets the admin user of
    imq.bridge.admin.user/password, so those credentials work from the first start."""
    repo = UserRepository(default_path(props))
    repo.ensure_admin(props.admin_user, props.admin_password)
    return repo


class UserRepository:
    """The users of one repository file; thread-safe."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._stamp: tuple[int, int] | None = None
        self._key = secrets.token_bytes(32)
        self._verified: set[bytes] = set()

    # --- reading --------------------------------------------------------------------
    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return (st.st_mtime_ns, st.st_size)

    def _load(self) -> dict[str, _Entry]:
        """The file's entries, re-read when it changed (the caller holds _lock)."""
        stamp = self._file_stamp()
        if stamp == self._stamp and (stamp is not None or not self._entries):
            return self._entries
        entries: dict[str, _Entry] = {}
        if stamp is not None:
            try:
                text = self.path.read_text(encoding="utf-8")
            except OSError as exc:
                raise UserRepositoryError(f"cannot read the user repository {self.path}: {exc}") from exc
            for lineno, line in enumerate(text.splitlines(), 1):
                if not line.strip() or line.lstrip().startswith("#"):
                    continue
                parts = line.split(":")
                if len(parts) != 3 or parts[1] not in GROUPS or not parts[2].startswith("scrypt$"):
                    raise UserRepositoryError(
                        f"{self.path}:{lineno}: not a user line (name:group:scrypt$...); fix or delete it"
                    )
                entries[parts[0]] = _Entry(User(parts[0], parts[1]), parts[2])
        self._entries, self._stamp = entries, stamp
        self._verified.clear()
        return entries

    def users(self) -> list[User]:
        with self._lock:
            return sorted((e.user for e in self._load().values()), key=lambda u: u.name)

    def get(self, name: str) -> User | None:
        with self._lock:
            entry = self._load().get(name)
            return entry.user if entry else None

    def is_empty(self) -> bool:
        with self._lock:
            return not self._load()

    def authenticate(self, name: str | None, password: str | None) -> User | None:
        """The user when ``password`` is theirs, else None. Slow (a scrypt hash) unless the
        same credentials were verified since the file last changed."""
        if name is None or password is None:
            return None
        with self._lock:
            entry = self._load().get(name)
        if entry is None:
            hash_password(password)  # spend the same time: no timing hint that the name is unknown
            return None
        token = self._token(name, password, entry)
        if token in self._verified:
            return entry.user
        if not verify_password(password, entry.password_hash):
            return None
        with self._lock:
            self._verified.add(token)
        return entry.user

    def verified(self, name: str, password: str) -> User | None:
        """The user when these very credentials passed :meth:`authenticate` since the file
        last changed, else None (then ask ``authenticate``). No hash: quick enough for an
        event loop (the management port checks every request's credentials)."""
        with self._lock:
            entry = self._load().get(name)
            if entry is None or self._token(name, password, entry) not in self._verified:
                return None
            return entry.user

    def _token(self, name: str, password: str, entry: _Entry) -> bytes:
        return hmac.new(self._key, f"{name}\0{password}\0{entry.password_hash}".encode(), hashlib.sha256).digest()

    # --- editing ----------------------------------------------------------------------
    @contextmanager
    def _editing(self) -> Iterator[dict[str, _Entry]]:
        private_dir(self.path.parent)
        with open_private_text(f"{self.path}.lock", "a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            with self._lock:
                self._stamp = None  # re-read under the file lock
                self._entries = {}
                before = dict(self._load())
                entries = dict(before)
                yield entries
                if entries != before:
                    self._write(entries)
                    self._stamp = None

    def _write(self, entries: dict[str, _Entry]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        lines = [HEADER] + [
            f"{e.user.name}:{e.user.group}:{e.password_hash}\n"
            for e in sorted(entries.values(), key=lambda e: e.user.name)
        ]
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.writelines(lines)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise UserRepositoryError(f"cannot write the user repository {self.path}: {exc}") from exc

    def add(self, name: str, password: str, group: str = "user", *, replace: bool = False) -> User:
        """Add a user (or, with ``replace``, set an existing user's password and group)."""
        check_name(name)
        if group not in GROUPS:
            raise UserRepositoryError(f"group {group!r} is not one of {', '.join(GROUPS)}")
        if not password:
            raise UserRepositoryError("the password must not be empty")
        password_hash = hash_password(password)
        with self._editing() as entries:
            if name in entries and not replace:
                raise UserRepositoryError(f"user {name!r} already exists in {self.path}")
            entries[name] = _Entry(User(name, group), password_hash)
        return User(name, group)

    def delete(self, name: str) -> None:
        with self._editing() as entries:
            if name not in entries:
                raise UserRepositoryError(f"user {name!r} does not exist in {self.path}")
            del entries[name]

    def ensure_admin(self, name: str | None, password: str | None) -> bool:
        """A fresh service: when the repository is empty (but for the service account), add
        ``name`` as an admin so the configured admin credentials work. True when it added
        the user."""
        if not name or not password:
            return False
        with self._editing() as entries:
            if set(entries) - {SERVICE_ACCOUNT}:
                return False
            check_name(name)
            entries[name] = _Entry(User(name, "admin"), hash_password(password))
        return True
