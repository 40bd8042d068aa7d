"""JNDI lookups through a real javax.naming.InitialContext.

JavaContextFactory is what bridgemgr.jms.naming uses when java.naming.factory.initial names
a Java class. It starts the JVM if needed, turns the lookup environment (the <property>
elements) into a java.util.Hashtable and builds a real javax.naming.InitialContext with it,
under the provider's class loader: the JVM's classpath, or an isolated loader when the
environment names imq.bridge.java.classpath (see jvm.py). lookup() wraps what JNDI returns:
an XAConnectionFactory or a ConnectionFactory as our SPI factory, a Destination as our
Queue/Topic; anything else comes back as the Java object, which the bridge then reports as
"not a connection factory".
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ...jms import naming
from ...jms.errors import MessageFormatException, NamingException
from . import jvm
from .client import wrap_factory
from .convert import flavor_of, to_python_destination
from .jvm import java_errors


def wrap(jobj: Any) -> Any:
    """Our SPI object for what a Java lookup returned (the Java object if none fits)."""
    if jobj is None:
        return None
    try:
        flavor = flavor_of(jobj)
    except MessageFormatException:
        return jobj
    if isinstance(jobj, (flavor.ConnectionFactory, flavor.XAConnectionFactory)):
        return wrap_factory(jobj)
    if isinstance(jobj, flavor.Destination):
        return to_python_destination(jobj, flavor)
    return jobj


class JavaContext(naming.Context):
    def __init__(self, jcontext: Any, loader: Any, where: str) -> None:
        self.java = jcontext
        self.loader = loader
        self.where = where

    def lookup(self, name: str) -> Any:
        try:
            with java_errors(f"lookup {name!r}"), jvm.context_loader(self.loader):
                return wrap(self.java.lookup(name))
        except NamingException as exc:
            raise NamingException(f"{exc} (classes from {self.where})") from None

    def close(self) -> None:
        with java_errors("close InitialContext"):
            self.java.close()


class JavaContextFactory(naming.InitialContextFactory):
    """java.naming.factory.initial = a Java InitialContextFactory class."""

    def get_initial_context(self, environment: Mapping[str, str]) -> naming.Context:
        entries = jvm.split_classpath(environment.get(jvm.CLASSPATH_PROPERTY))
        jvm.start()
        if entries:
            loader, where = jvm.isolated_loader(entries), os.pathsep.join(entries)
        else:
            loader = jvm.default_loader()
            where = f"the JVM classpath ({os.pathsep.join(jvm.classpath()) or 'empty'}; set {jvm.CLASSPATH_PROPERTY})"
        table = jvm.jclass("java.util.Hashtable")()
        for key, value in environment.items():
            if key != jvm.CLASSPATH_PROPERTY and value is not None:
                table.put(key, value)
        try:
            with java_errors("InitialContext"), jvm.context_loader(loader):
                jcontext = jvm.jclass("javax.naming.InitialContext")(table)
        except NamingException as exc:
            raise NamingException(f"{exc} (classes from {where})") from None
        return JavaContext(jcontext, loader, where)
