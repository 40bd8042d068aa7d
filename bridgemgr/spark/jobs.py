# How it works: a CLI job (drain, dmq archive|report|redrive) runs in its own process,
# next to a running service. job_options gives it the admin commands' options (-b, -u,
# -passfile, -secure, --cafile, -rtm, -rtr, plus -bn); service_job() logs in to the admin
# port found through the port mapper at -b, asks CONFIG for the bridge, loads the bridge
# XML the service uses, and gives the job a factory for the service's host broker over its
# jms connection service (mq://<-b>, the port mapper resolves it) with the login of the
# service account the CONFIG reply names (never the admin's), and the DMQ marker key:
# the job resolves every connection factory of the bridge XML that means "the host
# broker" to it (host_factory).
"""What a CLI job needs from the running service: its bridge's configuration and broker."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click

from ..admin.client import AdminError
from ..admin.login import admin_login, admin_options, host_port, open_admin
from ..admin.protocol import Command
from ..extras import require
from .options import BACKOUT_THRESHOLD

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ..jms.spi import XAConnectionFactory
    from ..jmsbridge.config import BridgeConfig


@dataclass(frozen=True)
class ServiceJob:
    """One job's view of the service and of the JMS bridge it works on."""

    broker_url: str                    # the host broker's jms connection service
    bridge: str
    xmlurl: str
    config: BridgeConfig
    runner: str = "local"
    backout_threshold: int = BACKOUT_THRESHOLD
    spark_master: str = "local[*]"
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    user: str | None = field(default=None, repr=False)      # the admin login (admin port)
    password: str | None = field(default=None, repr=False)
    broker_user: str | None = field(default=None, repr=False)  # the service account (host broker)
    broker_password: str | None = field(default=None, repr=False)
    dmq_key: bytes | None = field(default=None, repr=False)  # verifies the DMQ marker

    def host_factory(self, environment: Mapping[str, str]) -> XAConnectionFactory:
        """The service's host broker; connections that name no user log in as the
        service account."""
        from ..providers.embedded import HostBrokerFactory

        return HostBrokerFactory(self.broker_url, self.broker_user, self.broker_password)

    def spark(self, app_name: str, **conf: Any) -> SparkSession:
        """The job's SparkSession: the service's imq.bridge.spark.* settings, then ``conf``."""
        from .session import SparkUnavailable, spark_session

        try:
            return spark_session(app_name=app_name, master=self.spark_master,
                                 conf={**self.spark_conf, **conf})
        except SparkUnavailable as exc:
            raise click.ClickException(str(exc)) from None


def require_spark() -> None:
    """A job command's first step: one line naming imqbridge[spark] when pyspark or pyarrow
    is not installed, before the service is asked anything (or a link paused)."""
    from .session import SPARK_PART

    require(SPARK_PART, "pyspark", "pyarrow", error=click.ClickException)


def job_options(fn: Callable[..., Any] | None = None, *, bridge_required: bool = True) -> Any:
    """-bn and the admin commands' options; the command gets them as keyword arguments
    broker, bridge, user, passfile, secure, cafile, reply_timeout, retries. A command that
    can also work without the service says bridge_required=False and checks -bn itself."""
    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn = admin_options(fn)
        return click.option("-bn", "bridge", required=bridge_required, metavar="NAME",
                            help="The JMS bridge whose configuration the job uses.")(fn)
    return decorate if fn is None else decorate(fn)


def service_job(broker: str, bridge: str, user: str | None, passfile: str | None,
                secure: bool = False, cafile: str | None = None, reply_timeout: int = 10,
                retries: int = 5) -> ServiceJob:
    """Ask the service at ``broker`` about ``bridge`` and connect this process to its host
    broker; ClickException with the service's answer when it cannot."""
    from ..jmsbridge.config import load_bridge_config
    from ..props import ConfigError

    host, port = host_port(broker)
    user, password = admin_login(user, passfile)
    try:
        with open_admin(broker, user, password, secure, cafile, reply_timeout, retries) as client:
            reply = client.request(Command("CONFIG", None, bridge, None))
    except AdminError as exc:
        raise click.ClickException(str(exc)) from None
    if not reply.ok:
        raise click.ClickException(reply.message)
    data = reply.data
    if not data.get("xmlurl"):
        raise click.ClickException(f"bridge {bridge} has no imq.bridge.{bridge}.xmlurl")
    try:
        config = load_bridge_config(data["xmlurl"], bridge_name=bridge)
    except ConfigError as exc:
        raise click.ClickException(f"the configuration of bridge {bridge} cannot be loaded:\n{exc}") from None
    url = f"mq://{'[' + host + ']' if ':' in host else host}:{port}"
    spark = data.get("spark") or {}
    account = data.get("service") or {}
    if not account.get("user"):
        raise click.ClickException(f"the service at {broker} names no service account for jobs; "
                                   "upgrade it")
    return ServiceJob(url, bridge, data["xmlurl"], config, runner=data.get("runner", "local"),
                      backout_threshold=int(data.get("backoutThreshold", BACKOUT_THRESHOLD)),
                      spark_master=spark.get("master") or "local[*]",
                      spark_conf=dict(spark.get("conf") or {}), user=user, password=password,
                      broker_user=account["user"], broker_password=account.get("password"),
                      dmq_key=bytes.fromhex(account.get("dmqKey") or ""))
