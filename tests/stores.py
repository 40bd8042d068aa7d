"""Brokers on a store spec: a directory (the SQLite store) or
``jdbc:postgresql://host:port/db?user=U#schema`` (the jdbc store in that schema), so the
crash tests run the same workload on both stores, in this process or a child."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bridgemgr.providers.embedded import Broker
from bridgemgr.providers.embedded.pgstore import JdbcSettings, PostgresDatabase, parse_jdbc_url


def jdbc(spec: str | Path) -> JdbcSettings | None:
    text = str(spec)
    if not text.startswith("jdbc:"):
        return None
    return JdbcSettings(parse_jdbc_url(text.split("#")[0]), urlsplit(text).fragment or "imq_test")


def open_at(spec: str | Path, sync: bool = False, **options: Any) -> Broker:
    settings = jdbc(spec)
    if settings is None:
        return Broker(spec, sync=sync, **options)
    return Broker(None, sync=sync, database=PostgresDatabase(settings, sync), **options)
