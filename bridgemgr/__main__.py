"""python -m bridgemgr: the imqbridgemgr command."""

from .cli import PROG, main

main(prog_name=PROG)
