"""A context factory for tests: the embedded provider's mq:// factories, said to make
local transactions (a provider whose plain sessions consume and produce in one local
transaction, as the Java provider's ActiveMQ factories are), so that a transacted link
between two queues of one host broker runs as one local transaction (LocalTransaction)
against the real broker. Named in a bridge XML as
java.naming.factory.initial=tests.local_embedded:LocalEmbedded."""

from __future__ import annotations

from collections.abc import Mapping

from bridgemgr.jms import naming
from bridgemgr.providers.embedded import EmbeddedContextFactory


class LocalEmbedded(naming.InitialContextFactory):
    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        return _Local(EmbeddedContextFactory().get_initial_context(environment))


class _Local(naming.Context):
    def __init__(self, context: naming.Context) -> None:
        self.context = context

    def lookup(self, name: str) -> object:
        found = self.context.lookup(name)
        if name.endswith("ConnectionFactory"):
            found.local_transactions = True
        return found
