"""Any Java JMS provider (javax.jms or jakarta.jms) through JPype and real JNDI.

A ``lookup-name`` whose ``java.naming.factory.initial`` is a Java class name (for example
``org.apache.activemq.jndi.ActiveMQInitialContextFactory``) resolves here: the process's
one JVM starts on first use, a real ``javax.naming.InitialContext`` is built from the
``<property>`` elements, and what it returns is wrapped behind our provider SPI:

=================================  ==========================================================
Java object                        ours
=================================  ==========================================================
XAConnectionFactory                :class:`JavaXAConnectionFactory` (XA-capable: transacted
                                   links may use it; its XAResource is real)
ConnectionFactory                  :class:`JavaConnectionFactory`
Queue / Topic / temporary ones     Queue / Topic / TemporaryQueue / TemporaryTopic
=================================  ==========================================================

The classes come from the JVM's classpath (:mod:`.jvm`: ``imq.bridge.java.classpath``,
``$IMQ_BRIDGE_JAVA_CLASSPATH``, the ``lib/ext`` folders); messages convert losslessly
(:mod:`.convert`), XA resources keep their Xids across restarts (:mod:`.xa`), and a
``message-transformer-class`` may be a Java class (:mod:`.transformer`).

Design notes: docs/architecture.md#internals-the-providersjava-package.
"""

from __future__ import annotations

from ...jms import naming
from ...transform import register_transformer_loader
from .client import (
    JavaConnection,
    JavaConnectionFactory,
    JavaXAConnection,
    JavaXAConnectionFactory,
    JavaXASession,
    wrap_factory,
)
from .context import JavaContextFactory
from .jvm import CLASSPATH_PROPERTY, close_all, configure, configure_from_properties, is_started
from .transformer import JavaTransformer, install_finder, load_if_configured

__all__ = [
    "CLASSPATH_PROPERTY",
    "JavaConnection",
    "JavaConnectionFactory",
    "JavaContextFactory",
    "JavaTransformer",
    "JavaXAConnection",
    "JavaXAConnectionFactory",
    "JavaXASession",
    "close_all",
    "configure",
    "configure_from_properties",
    "is_started",
    "wrap_factory",
]

naming.register_context_factory(naming.JAVA_CONTEXT_FACTORY, JavaContextFactory)
register_transformer_loader("a Java transformer", load_if_configured)  # com.example.Upper
install_finder()
