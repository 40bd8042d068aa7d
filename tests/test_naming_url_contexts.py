"""The contexts of the providers reached by java.naming.provider.url (imq.stomp, imq.amqp),
which share jms/naming.py's UrlContext: what each binds, the credentials its factories
get, and its errors, to the letter (bridge configuration errors quote them)."""

from __future__ import annotations

import re

import pytest

from bridgemgr.jms import naming
from bridgemgr.jms.destination import Queue, Topic
from bridgemgr.jms.errors import NamingException
from bridgemgr.providers.amqp import AmqpConnectionFactory
from bridgemgr.providers.stomp import StompConnectionFactory

PROVIDERS = {
    "imq.stomp": (
        "stomp://127.0.0.1:1",
        StompConnectionFactory,
        "imq.stomp needs java.naming.provider.url (stomp://host:port or stomp+ssl://host:port)",
        "'Orders' is not bound in the STOMP context (use ConnectionFactory, queue/NAME, "
        "topic/NAME or a STOMP destination such as /queue/NAME)",
    ),
    "imq.amqp": (
        "amqp://127.0.0.1:1/%2F",
        AmqpConnectionFactory,
        "imq.amqp needs java.naming.provider.url (amqp://user:password@host:port/vhost)",
        "'Orders' is not bound in the AMQP context (use ConnectionFactory, queue/NAME or topic/NAME)",
    ),
}


def env(provider: str, **more: str) -> dict[str, str]:
    return {naming.INITIAL_CONTEXT_FACTORY: provider, naming.PROVIDER_URL: PROVIDERS[provider][0], **more}


@pytest.mark.parametrize("provider", PROVIDERS)
def test_destinations_and_factories_are_bound(provider):
    factory_class = PROVIDERS[provider][1]
    e = env(provider, **{naming.SECURITY_PRINCIPAL: "u", naming.SECURITY_CREDENTIALS: "pw"})
    assert naming.lookup("queue/a", e) == Queue("a")
    assert naming.lookup("dynamicQueues/a/b", e) == Queue("a/b")
    assert naming.lookup("topic/t", e) == Topic("t")
    assert naming.lookup("dynamicTopics/t", e) == Topic("t")
    for name in ("ConnectionFactory", "jms/MyConnectionFactory"):
        cf = naming.lookup(name, e)
        assert type(cf) is factory_class and cf.username == "u" and cf._password == "pw"
    assert naming.lookup("ConnectionFactory", env(provider)).username is None


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("name", ["Orders", "queue/", "topics/x"])
def test_an_unbound_name_is_refused_with_what_is_bound(provider, name):
    expected = PROVIDERS[provider][3].replace("'Orders'", repr(name))
    with pytest.raises(NamingException, match=f"^{re.escape(expected)}$"):
        naming.lookup(name, env(provider))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_missing_or_bad_url_fails_every_lookup(provider):
    missing = PROVIDERS[provider][2]
    with pytest.raises(NamingException, match=f"^{re.escape(missing)}$"):
        naming.lookup("queue/a", {naming.INITIAL_CONTEXT_FACTORY: provider})
    with pytest.raises(NamingException, match=re.escape("java.naming.provider.url='http://h:1'")):
        naming.lookup("queue/a", env(provider, **{naming.PROVIDER_URL: "http://h:1"}))


def test_stomp_also_binds_its_own_destination_names():
    assert naming.lookup("/queue/q", env("imq.stomp")) == Queue("q")
    assert naming.lookup("/topic/ConnectionFactory", env("imq.stomp")) == Topic("ConnectionFactory")


@pytest.mark.parametrize(
    "url",
    [
        "stomp://bob:s3cret@127.0.0.1:61613?nonsense=1",
        "stomp://bob:s3cret@127.0.0.1:notaport",
        "amqp://bob:s3cret@127.0.0.1:5672/?heartbeat=x",
    ],
)
def test_a_password_in_a_provider_url_is_in_no_error(url):
    env = {
        naming.INITIAL_CONTEXT_FACTORY: "imq.stomp" if url.startswith("stomp") else "imq.amqp",
        naming.PROVIDER_URL: url,
    }
    with pytest.raises(NamingException) as info:
        naming.lookup("ConnectionFactory", env)
    assert "s3cret" not in str(info.value) and "bob:***@" in str(info.value)


def test_a_password_in_a_stomp_url_is_not_in_the_factorys_repr():
    factory = StompConnectionFactory("stomp://bob:s3cret@127.0.0.1:61613")
    assert repr(factory) == "StompConnectionFactory(stomp://bob:***@127.0.0.1:61613)"
