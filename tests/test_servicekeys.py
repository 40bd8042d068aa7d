"""The instance's secrets in etc/ (0600, made once): the service account Spark links and CLI
jobs log in as instead of the admin (in group admin, in the user repository), and the DMQ
marker key; a runner=spark link's options carry the service account's login and the key,
not the admin's credentials (checked without Spark)."""

from __future__ import annotations

import stat

import pytest

from bridgemgr.props import load_properties
from bridgemgr.servicekeys import SERVICE_ACCOUNT, dmq_key, ensure_service_account, service_password
from bridgemgr.spark.runner import spark_link_options
from bridgemgr.users import User, UserRepository, open_repository


def props_in(tmp_path, *lines: str):
    file = tmp_path / "broker.properties"
    file.write_text(
        "\n".join(
            [
                f"imq.varhome={tmp_path / 'var'}",
                "imq.bridge.admin.user=admin",
                "imq.bridge.admin.password=Admin-Pw-1",
                *lines,
            ]
        )
        + "\n"
    )
    return load_properties([file], environ={})


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_dmq_key_and_the_service_password_are_made_once_0600(tmp_path):
    props = props_in(tmp_path)
    key, password = dmq_key(props), service_password(props)
    etc = props.instance_dir / "etc"
    assert len(key) == 32 and len(password) >= 32
    assert mode(etc / "dmq.key") == 0o600 and mode(etc / "service.password") == 0o600
    assert (dmq_key(props), service_password(props)) == (key, password)


@pytest.mark.slow
def test_the_service_account_is_an_admin_made_at_first_start_and_repaired(tmp_path):
    props = props_in(tmp_path)
    users = open_repository(props)  # a fresh repository: the configured admin first
    name, password = ensure_service_account(props, users)
    assert name == SERVICE_ACCOUNT and users.get(name) == User(name, "admin")
    assert users.authenticate(name, password) is not None
    assert users.get("admin") == User("admin", "admin")
    users.add(name, "changed-by-someone", "user", replace=True)
    assert ensure_service_account(props, users) == (name, password)
    assert users.authenticate(name, password) is not None and users.get(name).group == "admin"


def test_a_repository_holding_only_the_service_account_still_gets_the_admin(tmp_path):
    users = UserRepository(tmp_path / "passwd")
    users.add(SERVICE_ACCOUNT, "x" * 40, "admin")
    assert users.ensure_admin("admin", "Admin-Pw-1") and users.get("admin") is not None


def test_a_spark_links_options_carry_the_service_account_not_the_admin(tmp_path):
    props = props_in(tmp_path, "imq.bridge.b.type=jms", "imq.bridge.b.xmlurl=/b.xml", "imq.bridge.b.runner=spark")
    options, _ = spark_link_options(props, "b", "l", "mq://127.0.0.1:1")
    assert options.broker_user == SERVICE_ACCOUNT != "admin"
    assert options.broker_password == service_password(props) != "Admin-Pw-1"
    assert bytes.fromhex(options.dmq_secret) == dmq_key(props)
    assert "Admin-Pw-1" not in str(options.to_options())
