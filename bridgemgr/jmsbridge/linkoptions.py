"""The options every link in another process is rebuilt from, importable at no cost.

A link that runs outside the service's process (a parallel link's worker
processes, a runner=spark link's Spark processes) gets what it needs to rebuild itself as
plain values (linkenv.py does the rebuilding): the bridge XML's xmlurl, the bridge and
link names, the host broker's jms service and the login for it, the DMQ marker key and
the link's settings. Each runner extends SharedLinkOptions with its own (spark/options.py:
the source log, batch sizes). This module imports nothing on purpose: Spark unpickles
the options in short-lived processes that should not import the bridge.
"""

from __future__ import annotations

from dataclasses import dataclass

# props.BACKOUT_THRESHOLD, repeated so that this module stays light (test_props checks it)
BACKOUT_THRESHOLD = 5
# props.LINK_WINDOW, likewise
LINK_WINDOW = 1000
# props.LINK_WINDOW_BYTES, likewise
LINK_WINDOW_BYTES = 16 * 1024**2
# messages the host broker's jms service pushes ahead to a consumer of such a link
PREFETCH = 100


@dataclass(frozen=True)
class SharedLinkOptions:
    """One link's bridge XML, its host broker and its settings, for a process of its own."""

    xmlurl: str  # the bridge XML (absolute path or URL)
    bridge: str
    link: str
    broker_url: str  # the host broker's jms service (mq:// or mqtcp://)
    backout_threshold: int = BACKOUT_THRESHOLD
    transformer_path: str = ""  # os.pathsep-separated transformer folders ("" = default)
    send_window: int = 256  # unconfirmed persistent sends per session to the host broker
    window: int = LINK_WINDOW  # the link's confirm window (imq.bridge.<name>.link.window)
    window_bytes: int = LINK_WINDOW_BYTES  # ... full at this many record bytes too (-1: no bound)
    broker_user: str = ""  # for host-broker factories without a username: the
    broker_password: str = ""  # service account (an option named *password* is redacted by Spark)
    dmq_secret: str = ""  # the DMQ marker key, hex (*secret*: redacted too); "": no marker

    @property
    def prefetch(self) -> int:
        """The mq:// client's prefetch for the link's host broker consumers."""
        return PREFETCH
