"""Resolving a bridge's connection factories and destinations, and the XA rule for
transacted links.

Parsing a bridge XML never touches a provider; this module is the step
after it. resolve_connection_factories() turns <connection-factory> elements into
provider objects: a lookup-name goes through bridgemgr.jms.naming with the element's
properties as the JNDI environment; no lookup-name means the brokers of its
imqAddressList property over the mq:// client (imqcf.AddressListFactory), or without
one the host broker's factory, which the caller supplies (host_factory, called with
those properties). check_xa() applies
the chapter's rule that a transacted link's source and target factories are XA
connection factories, and names each offender with the file and line of its link.
resolve_destination() does the same for a <destination>. host_client_names() lists the
client ids and durable subscriptions a configuration uses on the host broker (what the
service reserves for the bridge).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..jms import naming
from ..jms.destination import Destination, Queue, Topic
from ..jms.errors import JMSException
from ..jms.spi import ConnectionFactory, is_xa_capable
from ..props import Problem, clip, shorten
from .config import BridgeConfig, ConnectionFactoryConfig, DestinationConfig, DestinationType, LinkConfig
from .imqcf import ADDRESS_LIST, EMBEDDED_CONTEXT, AddressListFactory, IMQSettings, imq_settings

HostFactory = Callable[[Mapping[str, str]], Any]
Lookup = Callable[[str, Mapping[str, str]], Any]


def with_host_broker(lookup: Lookup, host_factory: HostFactory) -> Lookup:
    """``lookup``, except that a connection factory of the ``imq.embedded`` context without
    a provider URL (the host broker, documented so) is ``host_factory``'s: the host broker
    the caller was given, not one the process would have to find."""

    def find(name: str, environment: Mapping[str, str]) -> Any:
        if (
            environment.get(naming.INITIAL_CONTEXT_FACTORY) == EMBEDDED_CONTEXT
            and not environment.get(naming.PROVIDER_URL)
            and name.endswith("ConnectionFactory")
        ):
            return host_factory(environment)
        return lookup(name, environment)

    return find


def resolve_connection_factories(
    config: BridgeConfig,
    host_factory: HostFactory | None = None,
    lookup: Lookup = naming.lookup,
    refs: Iterable[str] | None = None,
) -> tuple[dict[str, ConnectionFactory], list[Problem]]:
    """The connection factories named by ``refs`` (all by default), by ref-name.

    Host broker factories (no lookup-name, no imqAddressList) are skipped when
    ``host_factory`` is None. Every failed lookup is a problem; the others still resolve.
    """
    wanted = None if refs is None else set(refs)
    factories: dict[str, ConnectionFactory] = {}
    problems: list[Problem] = []
    for cf in config.connection_factories:
        if wanted is not None and cf.ref_name not in wanted:
            continue
        settings = IMQSettings()
        if cf.lookup_name is None:
            settings, noted = imq_settings(cf.properties, config.source, cf.line, cf.ref_name)
            refused = [p for p in noted if p.severity == "error"]
            if refused:  # a configuration built without its checks: never the host instead
                problems.extend(refused)
                continue
            if not settings.addresses and host_factory is None:
                continue
        addresses = settings.addresses
        what = (
            f"lookup-name {shorten(cf.lookup_name)} of connection-factory {shorten(cf.ref_name)}"
            if cf.lookup_name is not None
            else f"the {ADDRESS_LIST} of connection-factory {shorten(cf.ref_name)}"
            if addresses
            else f"the host broker's factory for connection-factory {shorten(cf.ref_name)}"
        )
        try:
            if cf.lookup_name is not None:
                found = lookup(cf.lookup_name, cf.environment)
            elif addresses:
                found = AddressListFactory(settings)
            else:
                assert host_factory is not None  # (else skipped above)
                found = host_factory(cf.environment)
        except Exception as exc:  # provider code: any failure is a problem to report
            problems.append(
                Problem(
                    config.source,
                    cf.line,
                    f"{what} cannot be found "
                    f"({type(exc).__name__}: {clip(str(exc), 160)}); "
                    "check lookup-name and the property elements",
                )
            )
            continue
        if not isinstance(found, ConnectionFactory):
            kind = f"{type(found).__module__}.{type(found).__qualname__}"
            problems.append(
                Problem(
                    config.source, cf.line, f"{what} is not a connection factory (it is a {kind}); check lookup-name"
                )
            )
            continue
        factories[cf.ref_name] = found
    return factories, problems


def _xa_links(config: BridgeConfig) -> list[LinkConfig]:
    """Links that will run in XA transactions (a disabled link never starts)."""
    return [link for link in config.links if link.enabled and link.transacted]


def check_xa(
    config: BridgeConfig, host_factory: HostFactory | None = None, lookup: Lookup = naming.lookup
) -> list[Problem]:
    """Every factory of a transacted link that is not XA-capable, plus failed lookups."""
    links = _xa_links(config)
    refs = {ref for link in links for ref in (link.source.connection_factory_ref, link.target.connection_factory_ref)}
    factories, problems = resolve_connection_factories(config, host_factory, lookup, refs)
    for link in links:
        for role, ref in (
            ("source", link.source.connection_factory_ref),
            ("target", link.target.connection_factory_ref),
        ):
            factory = factories.get(ref)
            if factory is None or is_xa_capable(factory):
                continue
            cf_line = config.connection_factory(ref).line
            problems.append(
                Problem(
                    config.source,
                    link.line,
                    f"link {shorten(link.name)} is "
                    f"transacted but its {role} connection factory "
                    f"{shorten(ref)} (line {cf_line}) is a "
                    f"{type(factory).__name__}, which cannot do XA; use an XA "
                    'connection factory or set transacted="false"',
                )
            )
    return problems


def resolve_destination(dest: DestinationConfig, lookup: Lookup = naming.lookup) -> Destination:
    """A <destination>: by JNDI lookup-name, or by name and type."""
    if dest.lookup_name is not None:
        found = lookup(dest.lookup_name, dest.environment)
        if not isinstance(found, Destination):
            raise JMSException(f"lookup-name {dest.lookup_name} is a {type(found).__name__}, not a destination")
        return found
    assert dest.name is not None
    return Topic(dest.name) if dest.type is DestinationType.TOPIC else Queue(dest.name)


def means_host_broker(cf: ConnectionFactoryConfig) -> bool:
    """Does this <connection-factory> reach the host broker (no lookup-name and no
    imqAddressList, or the imq.embedded context without a provider URL)?"""
    if cf.lookup_name is None:
        return not cf.imq.addresses
    env = cf.environment
    return env.get(naming.INITIAL_CONTEXT_FACTORY) == EMBEDDED_CONTEXT and not env.get(naming.PROVIDER_URL)


def host_client_names(config: BridgeConfig) -> tuple[set[str], set[tuple[str, str]]]:
    """The client ids and durable subscriptions (client id, name) the configuration's
    links, DMQs and connection factories use on the host broker: what the service keeps
    for the bridge while it is loaded (disabled links too: their subscriptions live on)."""
    host = {cf.ref_name for cf in config.connection_factories if means_host_broker(cf)}
    ids = {
        cf.imq.client_id
        for cf in config.connection_factories
        if cf.ref_name in host and cf.lookup_name is None and cf.imq.client_id
    }
    durables: set[tuple[str, str]] = set()
    for link in config.links:
        source, target = link.source, link.target
        if source.connection_factory_ref in host and source.clientid:
            ids.add(source.clientid)
            if source.durable_sub:
                durables.add((source.clientid, source.durable_sub))
        if target.connection_factory_ref in host and target.clientid:
            ids.add(target.clientid)
    ids |= {
        dmq.clientid
        for dmq in config.dmqs
        if dmq.clientid and (dmq.connection_factory_ref is None or dmq.connection_factory_ref in host)
    }
    return {i for i in ids if i}, durables
