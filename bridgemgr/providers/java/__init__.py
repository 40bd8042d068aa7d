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

Where the classes come from (:mod:`.jvm`): ``configure()`` / ``configure_from_properties()``
(``imq.bridge.java.classpath`` of the broker properties), ``$IMQ_BRIDGE_JAVA_CLASSPATH`` and
the ``lib/ext`` folders of ``$IMQ_HOME`` and of the broker instance form the JVM's classpath.
A lookup environment may also carry ``imq.bridge.java.classpath`` itself: that provider
then gets a class loader of its own (its jars must include the JMS API jar).

Messages convert losslessly (:mod:`.convert`; Java-serialised ObjectMessage bodies stay
opaque :class:`~bridgemgr.jms.message.JavaSerialized` bytes), XA resources keep their Xids
across restarts (:mod:`.xa`), and a ``message-transformer-class`` may be a Java class
(:mod:`.transformer`): name it by its Java name or as
``bridgemgr.providers.java.classes.<Java class name>``. It either extends the original's
``com.sun.messaging.bridge.service.MessageTransformer`` (a jar built for the original runs
unchanged: :mod:`.baseclass` compiles our copy of that base class with the JDK's javac at
first need, so branchTo(), noTransfer() and the create helpers work), or simply has a public
``transform(Message, boolean, String, String, String, Properties)`` and may offer
``getBranchTo()`` / ``isNoTransfer()``.
Every Java connection is closed at interpreter exit if its user did not close it.

Provider notes (ActiveMQ Classic 5.x, measured): its XAConnectionFactory makes XA sessions
even for non-transacted use, which then fail ("XAResource has not been enlisted") unless
the connection's xaAckMode is set, and cannot make locally transacted ones. Its class
extends the plain ActiveMQConnectionFactory, so an XA factory gets a plain twin (that class,
every JavaBean property copied: client.py's _plain_twin) that makes its plain connections:
non-transacted links and local transactions (a transacted link between two queues of one
broker) use those. Where no twin can be made, a non-transacted session of an XA
connection is made with xaAckMode set to the session's ack mode, so one
XAConnectionFactory serves both transacted (XA) and non-transacted links. Its
ObjectMessage bodies cross the bridge without ActiveMQ's trusted-packages list (they are
never deserialised here); only the Java consumer at the far end needs it.
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

__all__ = ["CLASSPATH_PROPERTY", "JavaConnection", "JavaConnectionFactory", "JavaContextFactory",
           "JavaTransformer", "JavaXAConnection", "JavaXAConnectionFactory", "JavaXASession",
           "close_all", "configure", "configure_from_properties", "is_started", "wrap_factory"]

naming.register_context_factory(naming.JAVA_CONTEXT_FACTORY, JavaContextFactory)
register_transformer_loader("a Java transformer", load_if_configured)  # com.example.Upper
install_finder()
