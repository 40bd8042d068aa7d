"""Reading the file an xmlurl names: paths, file: URLs and http(s) from a local server."""

from __future__ import annotations

import http.server
import os
import threading
import time
from pathlib import Path

import pytest

from bridgemgr.jmsbridge.config import DOCTYPE, ConfigError, load_bridge_config
from bridgemgr.jmsbridge.fetch import read_xmlurl

pytestmark = pytest.mark.timeout(30)

XML = (
    f'<?xml version="1.0"?>\n{DOCTYPE}\n<jmsbridge name="web">\n<connection-factory ref-name="cf"/>\n</jmsbridge>\n'
).encode()


class Site:
    """What the local web server serves: path -> (status, body, seconds to wait first)."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[int, bytes, float, dict[str, str]]] = {}
        self.requests: list[str] = []
        self.url = ""

    def add(self, path: str, body: bytes = XML, status: int = 200, delay: float = 0.0, **headers: str) -> str:
        self.pages[path] = (status, body, delay, headers)
        return self.url + path


@pytest.fixture
def site(monkeypatch):
    for var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    state = Site()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(self.path)
            status, body, delay, headers = state.pages.get(self.path, (404, b"", 0.0, {}))
            if delay:
                time.sleep(delay)
            try:
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key.replace("_", "-"), value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except OSError:
                pass  # the client gave up (timeouts)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()


# --- local files -------------------------------------------------------------------------


def test_plain_paths_and_file_urls(tmp_path):
    path = tmp_path / "my bridge.xml"
    path.write_bytes(XML)
    for url in (str(path), path.as_uri(), f"file:{path}", f"file://localhost{path}"):
        config = load_bridge_config(url)
        assert (config.name, config.source) == ("web", str(path)), url


def test_relative_paths_start_at_the_base_dir(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "b.xml").write_bytes(XML)
    assert load_bridge_config("conf/b.xml", base_dir=tmp_path).name == "web"
    monkeypatch.chdir(tmp_path / "conf")
    assert load_bridge_config("b.xml").name == "web"  # no base: the current directory


@pytest.mark.parametrize(
    "url,expected",
    [
        ("file://otherhost/x.xml", "names a file on another host"),
        ("ftp://example.com/b.xml", "uses the scheme ftp:, which is not supported"),
        ("jar:file:/x.jar!/b.xml", "uses the scheme jar:"),
        ("http://[::1", "is not a valid URL"),
    ],
)
def test_unsupported_urls(url, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[")):
        read_xmlurl(url)


def test_missing_file_directory_and_size_limit(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the bridge XML file: No such file"):
        load_bridge_config(str(tmp_path / "missing.xml"))
    with pytest.raises(ConfigError, match="Is a directory"):
        load_bridge_config(str(tmp_path))
    big = tmp_path / "big.xml"
    big.write_bytes(XML + b" " * 2000)
    with pytest.raises(ConfigError, match="is larger than 1000 bytes"):
        load_bridge_config(str(big), max_bytes=1000)


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "fifo.xml"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file"):
        load_bridge_config(str(fifo))


def test_errors_name_the_file_and_line(tmp_path):
    path = tmp_path / "b.xml"
    path.write_bytes(XML.replace(b'ref-name="cf"', b'ref-name="cf" multi-rm="no"'))
    with pytest.raises(ConfigError) as info:
        load_bridge_config(str(path))
    (problem,) = info.value.problems
    assert (problem.source, problem.line) == (str(path), 4)


# --- http(s) --------------------------------------------------------------------------------


def test_http_url(site):
    url = site.add("/imq/jmsbridge1.config.xml")
    config = load_bridge_config(url, bridge_name="web")
    assert (config.name, config.source) == ("web", url)
    assert site.requests == ["/imq/jmsbridge1.config.xml"]


def test_http_errors_name_the_url(site):
    url = site.add("/gone.xml", status=404)
    with pytest.raises(ConfigError) as info:
        load_bridge_config(url)
    assert str(info.value) == f"{url}: answered HTTP 404 Not Found; check the URL and the web server"


@pytest.mark.slow
def test_http_timeout_is_honoured(site):
    url = site.add("/slow.xml", delay=3.0)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"did not send the file within 0.3 seconds"):
        load_bridge_config(url, timeout=0.3)
    assert time.monotonic() - started < 2.0


def test_http_size_limit(site):
    url = site.add("/big.xml", body=XML + b" " * 5000)
    with pytest.raises(ConfigError, match="more than the 1000"):
        load_bridge_config(url, max_bytes=1000)


def test_http_redirects_to_file_urls_are_refused(site, tmp_path):
    secret = tmp_path / "secret.xml"
    secret.write_bytes(XML)
    url = site.add("/redirect.xml", status=302, Location=secret.as_uri())
    with pytest.raises(ConfigError, match=r"redirects to 'file:.*which is refused"):
        load_bridge_config(url)
    assert site.requests == ["/redirect.xml"]


def test_http_redirects_to_http_are_followed(site):
    site.add("/real.xml")
    url = site.add("/moved.xml", status=301, Location=site.url + "/real.xml")
    assert load_bridge_config(url).name == "web"
    assert site.requests == ["/moved.xml", "/real.xml"]


def test_nothing_listening(site):
    port = int(site.url.rsplit(":", 1)[1])
    with pytest.raises(ConfigError, match="cannot be read"):
        load_bridge_config(f"http://127.0.0.1:{port + 1 if port < 65535 else 1}/x.xml", timeout=2)


def test_read_xmlurl_returns_bytes_and_name(tmp_path):
    path = Path(tmp_path / "a.xml")
    path.write_bytes(b"<x/>")
    assert read_xmlurl(path.as_uri()) == (b"<x/>", str(path))
