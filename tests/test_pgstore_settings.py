"""The jdbc store's settings without a server: JDBC URLs parsed into psycopg connection
settings (hypothesis: any host, port, database, user and password round-trip; anything
else is a StoreError, never another exception), and what errors and logs show of them
(never the password)."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bridgemgr.props import load_properties
from bridgemgr.providers.embedded.pgstore import JdbcSettings, jdbc_settings, parse_jdbc_url, schema_name
from bridgemgr.providers.embedded.store import StoreError

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=20)
hosts = st.from_regex(r"[a-z][a-z0-9-]{0,15}(\.[a-z][a-z0-9-]{0,10}){0,2}", fullmatch=True)


@pytest.mark.slow
@given(hosts, st.integers(1, 65535), names, names, names)
def test_a_jdbc_url_round_trips(host, port, database, user, password):
    url = (
        f"jdbc:postgresql://{quote(user, safe='')}:{quote(password, safe='')}@{host}:{port}/"
        f"{quote(database, safe='')}?sslmode=require"
    )
    info = parse_jdbc_url(url)
    assert info == {
        "host": host,
        "port": str(port),
        "dbname": database,
        "user": user,
        "password": password,
        "sslmode": "require",
    }
    settings = JdbcSettings(info, schema_name("broker"))
    assert settings.where == f"postgresql://{user}@{host}:{port}/{database} (schema imq_broker)"


@given(st.text(max_size=60))
def test_any_text_is_a_url_or_a_store_error(text):
    try:
        info = parse_jdbc_url(text)
    except StoreError:
        return
    assert info["dbname"] and info["host"]


@pytest.mark.parametrize(
    "url", ["mysql://h/db", "jdbc:postgresql://h/", "jdbc:postgresql://h:99999/db", "postgresql:db"]
)
def test_not_a_postgresql_url(url):
    with pytest.raises(StoreError, match=r"jdbc:postgresql://|bad port"):
        parse_jdbc_url(url)


def test_properties_give_the_settings_and_the_schema():
    props = load_properties(
        [],
        [
            "imq.persist.store=jdbc",
            "imq.persist.jdbc.postgresql.property.url=jdbc:postgresql://db:6543/imq",
            "imq.persist.jdbc.postgresql.user=bridge",
            "imq.persist.jdbc.postgresql.password=S3cret!",
        ],
        environ={},
    )
    settings = jdbc_settings(props, "My-Broker.1")
    assert settings.conninfo == {"host": "db", "port": "6543", "dbname": "imq", "user": "bridge", "password": "S3cret!"}
    assert settings.schema == "imq_my_broker_1"
    assert settings.where == "postgresql://bridge@db:6543/imq (schema imq_my_broker_1)"
    assert "S3cret!" not in repr(props) and "S3cret!" not in str(props.redacted())
