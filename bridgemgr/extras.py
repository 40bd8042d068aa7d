"""The optional parts of imqbridge, installed as pip extras, and the one line that says
which extra to install when a part is used without it.

``pip install imqbridge`` gives the service, the embedded host broker, the STOMP bridge and
the STOMP provider; Spark, the Java provider, the PostgreSQL store, the AMQP provider and
the management port need packages of their own (pyproject.toml's optional-dependencies).
Each part imports its packages when first used, through :func:`require`, so a missing one
fails that use with "the Spark runner needs pyspark: pip install 'imqbridge[spark]'"
instead of a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# The top-level module of each optional package, and the extra that installs it.
EXTRA_OF = {
    "pyspark": "spark",
    "pyarrow": "spark",
    "jpype": "java",
    "psycopg": "postgres",
    "pika": "amqp",
    "starlette": "console",
    "uvicorn": "console",
}


def missing_extra(what: str, module: str) -> str:
    """The line that tells the user which extra ``what`` needs (``module`` is missing)."""
    return f"{what} needs {module}: pip install 'imqbridge[{EXTRA_OF[module]}]'"


def require(what: str, *modules: str, error: type[Exception]) -> list[ModuleType]:
    """Import ``modules`` (top-level names of EXTRA_OF) for ``what``; ``error`` with the line
    naming the extra when one is not installed (a module that is installed but fails to
    import raises as it does)."""
    found = []
    for module in modules:
        try:
            found.append(importlib.import_module(module))
        except ModuleNotFoundError as exc:
            if (exc.name or "").partition(".")[0] != module:
                raise  # the package is there; something it needs is not
            raise error(missing_extra(what, module)) from None
    return found
