"""imqbridge: a Bridge Service Manager for message-oriented middleware.

JMS bridges move messages between destinations of different providers, the STOMP
bridge lets STOMP clients reach the host broker, and ``imqbridgemgr`` operates both.
"""

__version__ = "0.1.0"
