"""Loading the message transformers a bridge XML names, for a start and for `check`.

A bridge's start (bridge.py, step 2) and `imqbridgemgr check` (bridgemgr/check.py)
load a bridge XML's message-transformer-class values with the same function,
load_configured_transformer(): bridgemgr.transform.load_transformer (the plugin folders
of plugin_folders(): imq.bridge.transformer.path, $IMQ_BRIDGE_TRANSFORMER_PATH,
<instance>/lib/ext, $IMQ_HOME/lib/ext; the Python path; then a Java class when Java is
configured), its failure
reworded to name the link or DMQ and where such a class has to be. So a transformer
that `check` passes is one the start loads, and one it names is one the start refuses.
`check` inspects rather than loads (inspect_configured_transformer(): the module's source
read with ast, so a plugin's import-time code does not run) where the source can say.
transformer_uses() lists every transformer a configuration names, for check.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..jms.errors import JMSException
from ..props import BrokerProperties
from ..transform import (
    TRANSFORMER_PATH_PROPERTY,
    MessageTransformer,
    TransformerInspection,
    inspect_transformer,
    load_transformer,
    transformer_path,
)
from .config import BridgeConfig

WHERE_TRANSFORMERS_ARE = (
    "put the module in <instance>/lib/ext, $IMQ_HOME/lib/ext or a folder of "
    "imq.bridge.transformer.path, or on the Python path; a Java class goes in a jar "
    "there or on imq.bridge.java.classpath"
)


@dataclass(frozen=True)
class TransformerUse:
    """A message-transformer-class of a link's target or of a DMQ."""

    class_path: str
    owner: str  # "link NAME" or "dmq NAME", as a start's errors name it
    line: int | None
    enabled: bool  # a start loads it (the link or DMQ is enabled)


def transformer_uses(config: BridgeConfig) -> list[TransformerUse]:
    """Every transformer the configuration names, in file order, links first."""
    uses = [
        TransformerUse(link.target.message_transformer_class, f"link {link.name}", link.target.line, link.enabled)
        for link in config.links
        if link.target.message_transformer_class
    ]
    uses += [
        TransformerUse(dmq.message_transformer_class, f"dmq {dmq.name}", dmq.line, dmq.enabled or dmq.is_builtin)
        for dmq in config.dmqs
        if dmq.message_transformer_class
    ]
    return uses


def plugin_folders(props: BrokerProperties) -> list[Path]:
    """Where the service looks for transformer modules: imq.bridge.transformer.path,
    $IMQ_BRIDGE_TRANSFORMER_PATH, <instance>/lib/ext, $IMQ_HOME/lib/ext."""
    return transformer_path(props.get(TRANSFORMER_PATH_PROPERTY), props.instance_dir)


def load_configured_transformer(
    class_path: str, owner: str, search_path: Sequence[str | os.PathLike[str]] | None = None
) -> MessageTransformer:
    """The transformer ``owner`` names, as a start loads it; a JMSException naming the
    owner, the cause and where the class has to be when it cannot be loaded."""
    try:
        return load_transformer(class_path, search_path)
    except JMSException as exc:
        raise JMSException(f"{owner}: {exc}; {WHERE_TRANSFORMERS_ARE}") from exc


def inspect_configured_transformer(
    class_path: str, owner: str, search_path: Sequence[str | os.PathLike[str]] | None = None
) -> TransformerInspection:
    """The transformer ``owner`` names checked as a start would load it, without importing
    its module where the source can say (transform.inspect_transformer); a JMSException
    as load_configured_transformer's when it is no transformer a start could use."""
    try:
        return inspect_transformer(class_path, search_path)
    except JMSException as exc:
        raise JMSException(f"{owner}: {exc}; {WHERE_TRANSFORMERS_ARE}") from exc
