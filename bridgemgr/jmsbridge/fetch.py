"""Reading a bridge XML file from the place its xmlurl names: a path, file: or http(s):.

Read_xmlurl() turns an imq.bridge.<name>.xmlurl value into bytes. SCHEMES
maps each URL scheme to a reader: plain paths and file: URLs are read from disk (regular
files only, so a FIFO or a device cannot hang or flood us), http: and https: through
urllib with a deadline for the whole transfer and redirects only to http(s). Every
reader stops at max_bytes. Failures become one ConfigError naming the URL.
"""

from __future__ import annotations

import http.client
import os
import stat
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from ..props import ConfigError, Problem, clip, shorten

DEFAULT_TIMEOUT = 10.0  # seconds for a whole http(s) transfer
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # bridge configurations are a few kilobytes
_CHUNK = 65536


def _fail(source: str, message: str) -> ConfigError:
    return ConfigError([Problem(source, None, message)])


def _read_path(path: Path, max_bytes: int) -> bytes:
    source = str(path)
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        with os.fdopen(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as fp:
            if not stat.S_ISREG(os.fstat(fp.fileno()).st_mode):
                raise _fail(source, "is not a regular file; point xmlurl at the bridge XML file")
            data = fp.read(max_bytes + 1)
    except OSError as exc:
        raise _fail(
            source, f"cannot read the bridge XML file: {exc.strerror or exc}; check imq.bridge.<name>.xmlurl"
        ) from None
    if len(data) > max_bytes:
        raise _fail(
            source,
            f"is larger than {max_bytes} bytes, which is too big for a bridge "
            "configuration; check that xmlurl names the right file",
        )
    return data


def _local(url: str, base_dir: Path | None) -> Path:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() == "file":
        if parts.netloc not in ("", "localhost"):
            raise _fail(url, "names a file on another host; mount it and use a local path")
        path = Path(urllib.request.url2pathname(parts.path))
    else:
        path = Path(url)
    return path if path.is_absolute() or base_dir is None else base_dir / path


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects to http(s) only (never to file: or ftp:)."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: http.client.HTTPMessage,
        newurl: str,
    ) -> urllib.request.Request | None:
        if urllib.parse.urlsplit(newurl).scheme.lower() not in ("http", "https"):
            raise urllib.error.HTTPError(newurl, code, f"redirect to {newurl} refused", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _read_http(url: str, timeout: float, max_bytes: int) -> bytes:
    opener = urllib.request.build_opener(_HttpOnlyRedirects())
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    try:
        with opener.open(url, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            if length and length.isdigit() and int(length) > max_bytes:
                raise _fail(
                    url, f"is {length} bytes, more than the {max_bytes} a bridge configuration may have; check the URL"
                )
            while chunk := response.read1(_CHUNK):
                size += len(chunk)
                chunks.append(chunk)
                if size > max_bytes:
                    raise _fail(
                        url, f"sent more than {max_bytes} bytes, too many for a bridge configuration; check the URL"
                    )
                if time.monotonic() > deadline:
                    raise TimeoutError
    except urllib.error.HTTPError as exc:
        location = exc.headers.get("Location") if exc.headers else None
        if 300 <= exc.code < 400 and location:
            raise _fail(
                url,
                f"redirects to {shorten(location, 120)}, which is refused; only redirects to http(s) URLs are followed",
            ) from None
        raise _fail(
            url, f"answered HTTP {exc.code} {clip(str(exc.reason))}; check the URL and the web server"
        ) from None
    except TimeoutError:
        raise _fail(url, f"did not send the file within {timeout:g} seconds; check the web server") from None
    except urllib.error.URLError as exc:
        raise _fail(url, f"cannot be read ({clip(str(exc.reason), 120)}); check the URL and the web server") from None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise _fail(url, f"cannot be read ({type(exc).__name__}: {clip(str(exc), 120)}); check the URL") from None
    return b"".join(chunks)


SCHEMES: Mapping[str, Callable[..., bytes]] = {"http": _read_http, "https": _read_http}


def read_xmlurl(
    url: str,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    max_bytes: int = MAX_CONFIG_BYTES,
) -> tuple[bytes, str]:
    """The bytes ``url`` names and the name to show in messages (path or URL)."""
    try:
        scheme = urllib.parse.urlsplit(url).scheme.lower()
    except ValueError:
        raise _fail(url, "is not a valid URL; write a path, a file: URL or an http(s): URL") from None
    if scheme in SCHEMES:
        return SCHEMES[scheme](url, timeout, max_bytes), url
    if scheme not in ("", "file") and len(scheme) > 1:  # one letter: a Windows drive
        raise _fail(
            url, f"uses the scheme {clip(scheme)}:, which is not supported; use a path, a file: URL or an http(s): URL"
        )
    path = _local(url, Path(base_dir) if base_dir is not None else None)
    return _read_path(path, max_bytes), str(path)
