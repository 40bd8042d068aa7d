package com.sun.messaging.bridge.service;

import java.util.Properties;

import jakarta.jms.Destination;
import jakarta.jms.Message;
import jakarta.jms.Queue;
import jakarta.jms.Session;
import jakarta.jms.Topic;

/**
 * The base class of a Java message transformer for imqbridge, with the shape of the Message
 * Queue bridge's class of the same name, so a transformer jar built for the original runs
 * unchanged. A subclass is public, has a public no-argument constructor and writes
 * {@link #transform}; during that call it may create messages and destinations for the
 * target and, on a JMS bridge link, redirect ({@link #branchTo}) or drop ({@link #noTransfer})
 * the message.
 *
 * <p>imqbridge compiles this file at first use against the JMS API the transformer was built
 * with (jakarta.jms as written here, or javax.jms by substitution; also under the package name
 * com.sun.messaging.bridge.api of newer releases). Before every call the bridge hands in the
 * target's session with {@link #init}; after it the bridge reads {@link #getBranchTo} and
 * {@link #isNoTransfer}.
 *
 * @param <T> what transform() returns (a JMS Message)
 * @param <S> what transform() is given (a JMS Message)
 */
public abstract class MessageTransformer<T, S> {

    /** Provider name of the host broker (source or target of a STOMP bridge call). */
    public static final String SUN_MQ = "SUN_MQ";

    /** Provider name of the STOMP side of a STOMP bridge call. */
    public static final String STOMP = "STOMP";

    /** Bridge type under which branchTo() and noTransfer() are allowed. */
    private static final String JMS_BRIDGE = "JMS";

    /** The kinds of message createJMSMessage() makes. */
    public enum JMSMessageType {
        MESSAGE, TEXTMESSAGE, BYTESMESSAGE, MAPMESSAGE, STREAMMESSAGE, OBJECTMESSAGE
    }

    private Session session;      // the target's, for new messages and destinations
    private String bridgeType;
    private Object branch;        // a Destination or a destination ref-name, or null
    private boolean dropped;

    /** Called by the bridge before each transform(): a new call starts with no branch and no drop. */
    public final void init(Object targetSession, String type) {
        session = (Session) targetSession;
        bridgeType = type;
        branch = null;
        dropped = false;
    }

    /** Read by the bridge after transform(): where branchTo() sent the message, or null. */
    public final Object getBranchTo() {
        return branch;
    }

    /** Read by the bridge after transform(): whether noTransfer() was called. */
    public final boolean isNoTransfer() {
        return dropped;
    }

    private Session target() {
        if (session == null) {
            throw new IllegalStateException(
                "MessageTransformer helpers are only available during transform()");
        }
        return session;
    }

    private void requireJmsBridge(String what) {
        target();
        if (!JMS_BRIDGE.equals(bridgeType)) {
            throw new UnsupportedOperationException(
                what + " is only available on a JMS bridge link, not on a " + bridgeType + " bridge");
        }
    }

    /** A new, empty message of the given kind, made by the target's session. */
    protected final Message createJMSMessage(JMSMessageType type) throws Exception {
        Session s = target();
        switch (type) {
            case TEXTMESSAGE:
                return s.createTextMessage();
            case BYTESMESSAGE:
                return s.createBytesMessage();
            case MAPMESSAGE:
                return s.createMapMessage();
            case STREAMMESSAGE:
                return s.createStreamMessage();
            case OBJECTMESSAGE:
                return s.createObjectMessage();
            case MESSAGE:
                return s.createMessage();
            default:
                throw new IllegalArgumentException("no message type " + type);
        }
    }

    /** A queue of the target provider. */
    protected final Queue createQueue(String queueName) throws Exception {
        return target().createQueue(queueName);
    }

    /** A topic of the target provider. */
    protected final Topic createTopic(String topicName) throws Exception {
        return target().createTopic(topicName);
    }

    /**
     * Send the returned message to another destination of the target: a Destination, or the
     * ref-name of a destination element of the bridge.
     */
    protected final void branchTo(Object destination) throws Exception {
        requireJmsBridge("branchTo()");
        if (destination == null) {
            throw new IllegalArgumentException("branchTo() needs a destination, not null");
        }
        if (!(destination instanceof String) && !(destination instanceof Destination)) {
            throw new IllegalArgumentException("branchTo() takes a String or a Destination, not a "
                + destination.getClass().getName());
        }
        branch = destination;
    }

    /** Consume the message from the source without sending it to the target. */
    protected final void noTransfer() throws Exception {
        requireJmsBridge("noTransfer()");
        dropped = true;
    }

    /**
     * The transformation.
     *
     * @param message the message to transform
     * @param readOnly whether message is read-only (clearBody()/clearProperties() make it writable)
     * @param charsetName the message's charset where one applies, else null
     * @param source the source provider's name
     * @param target the target provider's name
     * @param properties the property elements configured for this transformer, or null
     * @return the message to send (message itself, changed, or a new one); null is a failure
     * @throws Exception when the message cannot be transformed (a transform failure)
     */
    public abstract T transform(S message, boolean readOnly, String charsetName, String source,
                                String target, Properties properties) throws Exception;
}
