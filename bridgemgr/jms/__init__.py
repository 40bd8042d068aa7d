"""The JMS layer every provider and bridge builds on: messages, destinations, errors,
selectors, the codec, the provider SPI and JNDI-style naming. Nothing here imports
from above ``bridgemgr.jms``."""

from .destination import Destination, Queue, TemporaryQueue, TemporaryTopic, Topic
from .errors import *  # noqa: F401,F403
from .message import (
    BytesMessage,
    DeliveryMode,
    JavaSerialized,
    MapMessage,
    Message,
    ObjectMessage,
    PropertyType,
    StreamMessage,
    TextMessage,
    create_message,
    is_valid_property_name,
)
from .spi import (
    AUTO_ACKNOWLEDGE,
    CLIENT_ACKNOWLEDGE,
    DUPS_OK_ACKNOWLEDGE,
    INDIVIDUAL_ACKNOWLEDGE,
    SESSION_TRANSACTED,
    AckMode,
    Connection,
    ConnectionFactory,
    MessageConsumer,
    MessageProducer,
    QueueBrowser,
    Session,
    XAConnection,
    XAConnectionFactory,
    XAResource,
    XASession,
)
from .xa import Xid
