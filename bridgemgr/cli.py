"""imqbridgemgr: the command line (a thin click group; the work lives elsewhere)."""

from __future__ import annotations

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help", "-help"]})
@click.version_option(__version__, "-v", "--version", "-version", prog_name="imqbridgemgr")
def main() -> None:
    """imqbridgemgr: run and operate the Bridge Service Manager."""


if __name__ == "__main__":
    main()
