"""The browser console in real headless Chromium (Debian's chromium and chromedriver,
driven by selenium) against a real service: log in, the overview shows a link STARTED
whose rate moves while messages flow, pause and resume from the link page, a link whose
mq:// target service stopped turns red, a DMQ entry with its reason, a DMQ entry picked
and redriven to its link's target, a browsed message, a queue paged through, a read-only
user without actions, and no console error. Saves the screenshots that
docs/console.md shows (docs/images/console-overview.png, console-link.png, console-dmq.png)."""

from __future__ import annotations

import http.client
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bridgemgr.admin.protocol import Command
from bridgemgr.jms import Queue, TextMessage
from bridgemgr.providers.embedded import Broker
from service_support import console_service_overrides
from test_jmsbridge_linkdown import Far, far_factory
from waiting import wait_for

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the test extra)")
if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
    pytest.skip(f"no {CHROMIUM} and {CHROMEDRIVER} (Debian's chromium, chromium-driver)", allow_module_level=True)
from selenium.webdriver.common.by import By  # noqa: E402

IMAGES = Path(__file__).resolve().parent.parent / "docs" / "images"
PASSWORD = "adm1n-s3cret"
VIEWER = ("viewer", "v1ewer-pw")


def bridge_xml(far_url: str) -> str:
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE jmsbridge SYSTEM "sun_jmsbridge_1_0.dtd">
<jmsbridge name="jb">
  <link name="l1" transacted="false">
    <source connection-factory-ref="host" destination-ref="src"/>
    <target connection-factory-ref="host" destination-ref="dst" message-transformer-class="failonbad.FailOnBad"
            consume-no-transfer-on-transform-error="true"/>
  </link>
  <link name="l2" transacted="false">
    <source connection-factory-ref="host" destination-ref="src2"/>
    <target connection-factory-ref="far" destination-ref="dst"/>
  </link>
  <connection-factory ref-name="host"/>
  {far_factory(far_url)}
  <destination ref-name="src" name="cp.src"/>
  <destination ref-name="src2" name="cp.src2"/>
  <destination ref-name="dst" name="cp.dst"/>
</jmsbridge>
"""


@pytest.fixture(scope="module")
def far(tmp_path_factory):
    broker = Broker(tmp_path_factory.mktemp("far"))
    box = {"far": Far(broker)}
    yield box
    box["far"].stop()
    broker.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory, far):
    from bridgemgr.props import load_properties
    from bridgemgr.service import BridgeServiceManager

    base: Path = tmp_path_factory.mktemp("pages")
    overrides = console_service_overrides(base, bridge_xml(far["far"].url), PASSWORD)
    manager = BridgeServiceManager(load_properties(overrides=overrides))
    manager.start()
    try:
        manager.users.add(*VIEWER, group="user")
        wait_for(lambda: link_state(manager, "l2") == "STARTED", 30, "bridge jb's links started")
        yield manager
    finally:
        manager.stop()


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium driven by selenium, that logs every console message."""
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


@pytest.fixture
def page(browser, service):
    """The browser, logged in as admin on the console; afterwards: no console error."""
    log_in(browser, service, "admin", PASSWORD)
    yield browser
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors


def url(service, fragment: str = "") -> str:
    return f"http://127.0.0.1:{service.console.port}/{fragment}"


def log_in(driver, service, user: str, password: str) -> None:
    driver.delete_all_cookies()  # (of the page's origin: before leaving it)
    driver.get("about:blank")  # the page before stops
    driver.get_log("browser")  # what it logged belongs to the test before
    driver.get(url(service))
    form = wait_for(lambda: visible(driver, "login"), 10, "the login form")
    driver.find_element(By.ID, "login-user").send_keys(user)
    driver.find_element(By.ID, "login-password").send_keys(password)
    form.submit()
    wait_for(lambda: visible(driver, "top") and not visible(driver, "login"), 10, "the console after the login")


def visible(driver, element_id: str):
    found = driver.find_elements(By.ID, element_id)
    return found[0] if found and found[0].is_displayed() else None


def link_state(service, link: str) -> str:
    (row,) = service.dispatch(Command("LIST", bridge="jb", link=link)).data["links"]
    return row["state"]


def row(driver, link: str):
    """(class, state, rate) of link ``link``'s row on the overview, or None: read in one
    script, as the page replaces its rows every refresh."""
    found = driver.execute_script(
        "const r = document.querySelector(arguments[0]);"
        "return r && [r.className, r.querySelector('.state').textContent, r.querySelector('.rate').textContent];",
        f'tr[data-link="jb/{link}"]',
    )
    return None if found is None else (found[0], found[1], float(found[2]))


def text(driver, css: str) -> str | None:
    """The text of the first element matching ``css`` (one script: no stale element)."""
    return driver.execute_script("const e = document.querySelector(arguments[0]); return e && e.textContent;", css)


def send(service, queue: str, *texts: str) -> None:
    conn = service.host_broker.connection_factory().create_connection("admin")
    try:
        session = conn.create_session()
        producer = session.create_producer(Queue(queue))
        for text in texts:
            producer.send(TextMessage(text))
    finally:
        conn.close()


class Feeder:
    """Sends to a queue until stopped."""

    def __init__(self, service, queue: str) -> None:
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(service, queue), daemon=True)

    def _run(self, service, queue: str) -> None:
        while not self.stopping.wait(0.02):
            send(service, queue, *["m"] * 5)

    def __enter__(self) -> Feeder:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(10)


def test_the_shell_is_served_with_a_strict_csp_and_no_session(service):
    conn = http.client.HTTPConnection("127.0.0.1", service.console.port, timeout=10)
    try:
        conn.request("GET", "/")
        response = conn.getresponse()
        html = response.read().decode()
        csp = response.getheader("content-security-policy")
        assert response.status == 200 and 'data-session="none"' in html and "<script src=" in html
        assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp and "style-src 'self'" in csp
        conn.request("GET", "/static/console.js")
        script = conn.getresponse()
        assert script.status == 200 and b"X-CSRF-Token" in script.read()
    finally:
        conn.close()


def test_the_overview_shows_the_link_started_with_a_moving_rate(page, service):
    page.get(url(service, "#/"))
    with Feeder(service, "cp.src"):
        klass, state, rate = wait_for(lambda: (r := row(page, "l1")) and r[2] > 0 and r, 30, "l1's rate moving")
        assert "ok" in klass and state == "STARTED"
        wait_for(lambda: (r := row(page, "l1")) and r[2] != rate, 10, "l1's rate changing")
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.save_screenshot(str(IMAGES / "console-overview.png"))
    assert page.find_element(By.ID, "who").text == "admin (may act)"


def test_the_link_page_pauses_and_resumes_the_link(page, service):
    page.get(url(service, "#/link/jb/l1"))
    facts_state = lambda: text(page, "#link-facts dd.state")  # noqa: E731
    with Feeder(service, "cp.src"):
        wait_for(lambda: facts_state() == "STARTED", 10, "the link page")
        page.find_element(By.ID, "action-pause").click()
        wait_for(lambda: link_state(service, "l1") == "PAUSED" and facts_state() == "PAUSED", 10, "paused")
        page.find_element(By.ID, "action-resume").click()
        wait_for(lambda: link_state(service, "l1") == "STARTED" and facts_state() == "STARTED", 10, "resumed")
        points = "const p = document.querySelector('#rate-chart polyline'); return p && p.getAttribute('points')"
        # the service's history: a few 5-second intervals on the chart (for the screenshot)
        wait_for(lambda: len((page.execute_script(points) or "").split()) >= 3, 30, "the rate chart")
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.save_screenshot(str(IMAGES / "console-link.png"))


def test_a_link_whose_target_stopped_turns_red(page, service, far):
    page.get(url(service, "#/"))
    wait_for(lambda: (r := row(page, "l2")) and "ok" in r[0], 10, "l2 ok")
    far["far"].stop()
    try:
        send(service, "cp.src2", "to a stopped target")
        _, state, _ = wait_for(lambda: (r := row(page, "l2")) and "bad" in r[0] and r, 30, "l2's row red")
        assert state != "STARTED" or text(page, 'tr[data-link="jb/l2"] td.error')
    finally:
        far["far"] = far["far"].again()
    wait_for(lambda: (r := row(page, "l2")) and "ok" in r[0], 30, "l2 ok again")


def test_the_dmq_page_shows_an_entry_with_its_reason(page, service):
    send(service, "cp.src", "bad news")
    wait_for(lambda: service.dispatch(Command("LIST_DMQ", bridge="jb", count=10)).data["dmqs"][0]["entries"], 20)
    page.get(url(service, "#/dmq"))
    entry = wait_for(lambda: page.find_elements(By.CSS_SELECTOR, 'details.dmq-entry[data-reason="TRANSFORM_FAILURE"]'))
    entry[0].click()
    props = entry[0].find_element(By.CLASS_NAME, "dmq-properties").text
    assert "JMS_SUN_JMSBRIDGE_SOURCE_DESTINATION" in props and "bad message" in props


def test_the_dmq_page_redrives_a_picked_entry_to_its_links_target(page, service):
    conn = service.host_broker.connection_factory().create_connection("admin")
    try:
        original = TextMessage("bad, then redriven")
        conn.create_session().create_producer(Queue("cp.src")).send(original)
    finally:
        conn.close()

    def entry_id():
        dmqs = service.dispatch(Command("LIST_DMQ", bridge="jb", count=1000)).data["dmqs"]
        ids = [
            e["message"]["message_id"]
            for d in dmqs
            for e in d["entries"] or []
            if e["bridgeProperties"]["JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID"] == original.message_id
        ]
        return ids[0] if ids else None

    dead = wait_for(entry_id, 20, "the dead message")
    page.get(url(service, "#/dmq"))
    pick = wait_for(lambda: page.find_elements(By.CSS_SELECTOR, f'input.dmq-pick[data-id="{dead}"]'), 10, "its row")
    pick[0].click()
    IMAGES.mkdir(parents=True, exist_ok=True)
    page.save_screenshot(str(IMAGES / "console-dmq.png"))
    page.find_element(By.CSS_SELECTOR, 'button.dmq-action[data-action="redrive"][data-all="no"]').click()
    outcome = wait_for(lambda: text(page, "#dmq-outcome"), 10, "the outcome")
    assert outcome == "redrive: 1 of 1 moved", outcome
    assert entry_id() is None and not page.find_elements(By.CSS_SELECTOR, f'input.dmq-pick[data-id="{dead}"]')
    copies, after = [], None
    while True:  # every page of the link's target (the other tests' messages wait there too)
        browse = Command("BROWSE_DST", dst_type="q", destination="cp.dst", count=1000, after=after)
        waiting = service.dispatch(browse).data
        source = "JMS_SUN_JMSBRIDGE_SOURCE_MESSAGEID"
        copies += [m["body"] for m in waiting["messages"] if m["properties"].get(source) == original.message_id]
        if (after := waiting["next"]) is None:
            break
    assert copies == ["bad, then redriven"]


def test_the_destination_page_pages_through_a_queue(page, service):
    send(service, "cp.paged", *(f"paged {i}" for i in range(25)))
    page.get(url(service, "#/destinations/q/cp.paged"))
    previews = lambda: page.execute_script(  # noqa: E731  (one script: no stale element)
        "return [...document.querySelectorAll('#browse pre.preview')].map(p => p.textContent)"
    )
    wait_for(lambda: previews() == [f"paged {i}" for i in range(20)], 10, "the first page")
    page.find_element(By.ID, "browse-next").click()
    wait_for(lambda: previews() == [f"paged {i}" for i in range(20, 25)], 10, "the second page")
    assert text(page, "#browse-where").startswith("after ID:") and not page.find_elements(By.ID, "browse-next")
    page.find_element(By.ID, "browse-first").click()
    wait_for(lambda: previews()[:1] == ["paged 0"], 10, "the first page again")


def test_the_destinations_page_browses_a_queue(page, service):
    send(service, "cp.idle", "waiting <b>here</b>")
    page.get(url(service, "#/destinations/q/cp.idle"))
    preview = wait_for(lambda: page.find_elements(By.CSS_SELECTOR, "#browse pre.preview"), 10, "a browsed message")
    assert "waiting <b>here</b>" in preview[0].text  # shown as text, never as HTML
    wait_for(lambda: page.find_elements(By.CSS_SELECTOR, 'tr[data-destination="q/cp.idle"]'), 10, "the queue's row")


def test_a_user_who_may_only_read_sees_no_actions_and_logs_out(browser, service):
    log_in(browser, service, *VIEWER)
    browser.get(url(service, "#/link/jb/l1"))
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#link-facts dd.state"), 10, "the link page")
    assert browser.find_element(By.ID, "who").text == "viewer (read only)"
    assert not browser.find_elements(By.ID, "action-pause")
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    browser.find_element(By.ID, "logout").click()
    wait_for(lambda: visible(browser, "login") and not visible(browser, "top"), 10, "the login form again")
    assert not browser.get_cookies()  # the session cookie is gone
