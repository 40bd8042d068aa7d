"""What a link in a process of its own rebuilds from the bridge XML and its options.

A parallel link's workers and a runner=spark link's driver receiver and executors share no
globals with the service. What they need travels as SharedLinkOptions (linkoptions.py: the
bridge XML's xmlurl, the bridge and link names, the host broker's jms service URL and login,
the link's settings), and each such process rebuilds the rest from the bridge XML with the
same code the local runner uses (LinkEnvironment): the configuration, the destinations, the
connection factories (the host broker through the factory class its runner hands in: over
mq://, never in-process), the transformer, the DMQs. The transfer rules themselves stay in
pipeline.py.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from ..jms import naming
from ..jms.destination import Destination, Queue
from ..jms.errors import JMSException
from ..jms.spi import XAConnectionFactory
from ..transform import MessageTransformer, load_transformer
from .config import (
    BUILTIN_DMQ,
    BUILTIN_DMQ_DESTINATION,
    BridgeConfig,
    ConnectionFactoryConfig,
    LinkConfig,
    load_bridge_config,
)
from .connections import BridgeConnections, Connector
from .dmq import DeadMessageQueues, DMQSender
from .linkoptions import SharedLinkOptions
from .resolve import resolve_connection_factories, resolve_destination, with_host_broker


class LinkEnvironment:
    """The link's configuration and resources, built in a process of its own from its
    options. ``host_broker`` makes the host broker's connection factory from the options'
    URL, login (user, password: None for none) and mq:// client options (``send_window``,
    ``prefetch``): the runner hands in providers/embedded's HostBrokerFactory."""

    def __init__(
        self, options: SharedLinkOptions, log: logging.Logger, host_broker: Callable[..., XAConnectionFactory]
    ) -> None:
        self.options = options
        self.log = log
        self.config: BridgeConfig = load_bridge_config(options.xmlurl, bridge_name=options.bridge)
        self.link: LinkConfig = self.config.link(options.link)
        self.destinations: dict[str, Destination] = {}
        for dest in self.config.destinations:
            try:
                self.destinations[dest.ref_name] = resolve_destination(dest)
            except Exception as exc:  # unused ones only warn, as in the bridge
                if dest.ref_name in (self.link.source.destination_ref, self.link.target.destination_ref):
                    raise JMSException(
                        f"link {self.link.name}: destination {dest.ref_name} cannot be resolved: {exc}"
                    ) from exc
                log.warning("destination %s cannot be resolved (%s); branch_to cannot use it", dest.ref_name, exc)

        def host(environment: Mapping[str, str]) -> XAConnectionFactory:
            # connections that name no user log in with the service's login
            return host_broker(
                options.broker_url,
                options.broker_user or None,
                options.broker_password or None,
                send_window=options.send_window,
                prefetch=options.prefetch,
            )

        dmqs = [d for d in self.config.dmqs if d.enabled or d.is_builtin]
        refs = {self.link.source.connection_factory_ref, self.link.target.connection_factory_ref}
        refs |= {d.connection_factory_ref for d in dmqs if not d.is_builtin and d.connection_factory_ref is not None}
        factories, problems = resolve_connection_factories(
            self.config, host, with_host_broker(naming.lookup, host), refs
        )
        if problems:
            raise JMSException("; ".join(str(p) for p in problems))
        self.connectors = {
            ref: Connector(self.config.connection_factory(ref), factory, log) for ref, factory in factories.items()
        }
        self.connectors[BUILTIN_DMQ] = Connector(
            ConnectionFactoryConfig(BUILTIN_DMQ, connect_attempts=1), host({}), log
        )
        self._dmq_configs = dmqs

    @property
    def source(self) -> Destination:
        return self.destinations[self.link.source.destination_ref]

    @property
    def target(self) -> Destination | None:
        return None if self.link.target.as_source else self.destinations[self.link.target.destination_ref]

    @property
    def window_bytes(self) -> int:
        """The link's windowBytes: its XML property, else the bridge's link.windowBytes
        (-1: no byte bound)."""
        return self.link.window_bytes if self.link.window_bytes is not None else self.options.window_bytes

    def transformer(self, class_path: str | None) -> MessageTransformer | None:
        if class_path is None:
            return None
        path = [p for p in self.options.transformer_path.split(os.pathsep) if p]
        return load_transformer(class_path, path or None)

    def dead_message_queues(self, connections: BridgeConnections) -> DeadMessageQueues:
        """The bridge's DMQs in the chapter's order (built-in first), as the bridge has them."""
        senders = []
        key = bytes.fromhex(self.options.dmq_secret) if self.options.dmq_secret else None
        for dmq in self._dmq_configs:
            if dmq.is_builtin:
                dest: Destination = Queue(BUILTIN_DMQ_DESTINATION)
                ref = BUILTIN_DMQ
            else:  # only the built-in DMQ has no destination and factory refs
                assert dmq.destination_ref is not None and dmq.connection_factory_ref is not None
                dest = self.destinations[dmq.destination_ref]
                ref = dmq.connection_factory_ref
            senders.append(
                DMQSender(
                    dmq,
                    dest,
                    ref,
                    connections,
                    self.log,
                    self.transformer(dmq.message_transformer_class),
                    marker_key=key,
                )
            )
        return DeadMessageQueues(senders, self.log)
