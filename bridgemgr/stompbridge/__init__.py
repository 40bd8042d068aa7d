"""The STOMP bridge: STOMP 1.0/1.1/1.2 clients reach the host broker (chapter 12, Tables 12-10
and 12-11). frames: the sans-IO codec; session: the protocol state machine; convert: STOMP
<-> JMS; host: the broker side of a connection; server: the asyncio TCP/TLS service."""

from .server import StompBridge, StompBridgeError, StompConfig
from .session import SessionConfig

__all__ = ["SessionConfig", "StompBridge", "StompBridgeError", "StompConfig"]
