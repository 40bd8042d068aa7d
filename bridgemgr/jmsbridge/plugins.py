# How it works: a bridge's start (bridge.py, step 2) and `imqbridgemgr check` (check.py)
# load a bridge XML's message-transformer-class values with the same function,
# load_configured_transformer(): bridgemgr.transform.load_transformer (the transformer
# folders, the Python path, then a Java class when Java is configured), its failure
# reworded to name the link or DMQ and where such a class has to be. So a transformer
# that `check` passes is one the start loads, and one it names is one the start refuses.
# transformer_uses() lists every transformer a configuration names, for check.
"""Loading the message transformers a bridge XML names, for a start and for `check`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from ..jms.errors import JMSException
from ..transform import MessageTransformer, load_transformer
from .config import BridgeConfig

WHERE_TRANSFORMERS_ARE = (
    "put the module in a transformer folder (transformers/, or one in "
    "$IMQ_BRIDGE_TRANSFORMER_PATH) or on the Python path; a Java class goes on "
    "imq.bridge.java.classpath or in <instance>/lib/ext")


@dataclass(frozen=True)
class TransformerUse:
    """A message-transformer-class of a link's target or of a DMQ."""

    class_path: str
    owner: str  # "link NAME" or "dmq NAME", as a start's errors name it
    line: int | None
    enabled: bool  # a start loads it (the link or DMQ is enabled)


def transformer_uses(config: BridgeConfig) -> list[TransformerUse]:
    """Every transformer the configuration names, in file order, links first."""
    uses = [TransformerUse(link.target.message_transformer_class, f"link {link.name}",
                           link.target.line, link.enabled)
            for link in config.links if link.target.message_transformer_class]
    uses += [TransformerUse(dmq.message_transformer_class, f"dmq {dmq.name}", dmq.line,
                            dmq.enabled or dmq.is_builtin)
             for dmq in config.dmqs if dmq.message_transformer_class]
    return uses


def load_configured_transformer(class_path: str, owner: str,
                                search_path: Sequence[str | os.PathLike[str]] | None = None
                                ) -> MessageTransformer:
    """The transformer ``owner`` names, as a start loads it; a JMSException naming the
    owner, the cause and where the class has to be when it cannot be loaded."""
    try:
        return load_transformer(class_path, search_path)
    except JMSException as exc:
        raise JMSException(f"{owner}: {exc}; {WHERE_TRANSFORMERS_ARE}") from exc
