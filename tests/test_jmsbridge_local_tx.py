"""Which unit of work a transacted link gets: a local transaction when its two ends are
one resource manager (the same JNDI lookup, environment and credentials) and the provider
says its plain connections make locally transacted sessions; XA otherwise, or with
imq.bridge.<name>.transaction.local=false."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bridgemgr.jms.spi import XAConnectionFactory
from bridgemgr.jmsbridge.config import ConnectionFactoryConfig, Property
from bridgemgr.jmsbridge.transfer import (
    LocalTransaction,
    XATransaction,
    one_resource_manager,
    transaction_for,
)
from bridgemgr.props import load_properties

AMQ = ConnectionFactoryConfig(
    "src",
    lookup_name="XAConnectionFactory",
    username="u",
    password="p",
    properties=(Property("java.naming.provider.url", "tcp://a:61616"),),
)


class Factory(XAConnectionFactory):
    def __init__(self, local: bool) -> None:
        self.local_transactions = local

    def create_connection(self, username=None, password=None):
        raise NotImplementedError

    def create_xa_connection(self, username=None, password=None):
        raise NotImplementedError


def test_same_lookup_environment_and_login_is_one_resource_manager():
    assert one_resource_manager(AMQ, replace(AMQ, ref_name="dst", description="x"), None)


@pytest.mark.parametrize(
    "other",
    [
        replace(AMQ, properties=(Property("java.naming.provider.url", "tcp://b:61616"),)),
        replace(AMQ, username="v"),
        replace(AMQ, password="q"),
        replace(AMQ, lookup_name="OtherXAConnectionFactory"),
        replace(AMQ, multi_rm=True),
    ],
)
def test_another_broker_or_user_is_not(other):
    assert not one_resource_manager(AMQ, other, None)


def test_host_factories_and_a_target_clientid_are_not():
    host = ConnectionFactoryConfig("host")
    assert not one_resource_manager(host, replace(host, ref_name="h2"), None)
    assert not one_resource_manager(AMQ, AMQ, "target-client")


def test_local_only_where_the_provider_makes_local_transactions():
    assert transaction_for(True, Factory(True), Factory(True), None, local=True) is LocalTransaction
    with pytest.raises(Exception, match="no XA coordinator"):  # no local path: XA as before
        transaction_for(True, Factory(False), Factory(False), None, local=True)
    assert LocalTransaction.kind != XATransaction.kind  # the link's log and info tell them apart


def test_the_opt_out_property():
    def local(*lines: str) -> bool:
        props = load_properties([], ["imq.bridge.b.type=jms", "imq.bridge.b.xmlurl=b.xml", *lines], environ={})
        return props.bridge("b").transaction_local

    assert local() is True
    assert local("imq.bridge.b.transaction.local=false") is False
