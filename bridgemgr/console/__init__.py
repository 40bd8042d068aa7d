"""The management port: the REST API under /api/v1 (api.py) served by uvicorn on the
service's network loop behind the guards of the other ports (server.py).

Design notes: docs/console.md#internals-console.
"""
