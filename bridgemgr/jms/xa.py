"""X/Open XA as JMS providers expose it: Xid, flags, return and error codes.

The constants are the javax.transaction.xa values, so Xids and codes mean the same
thing on either side of the JPype bridge and in transaction logs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# flags for start/end/recover
TMNOFLAGS = 0
TMJOIN = 0x00200000
TMRESUME = 0x08000000
TMSUCCESS = 0x04000000
TMFAIL = 0x20000000
TMSUSPEND = 0x02000000
TMSTARTRSCAN = 0x01000000
TMENDRSCAN = 0x00800000
TMONEPHASE = 0x40000000

# prepare votes
XA_OK = 0
XA_RDONLY = 3

# error codes (XAException.errorcode)
XA_RBROLLBACK = 100
XA_RBTIMEOUT = 106
XA_HEURMIX = 5
XA_HEURRB = 6
XA_HEURCOM = 7
XAER_ASYNC = -2
XAER_RMERR = -3
XAER_NOTA = -4
XAER_INVAL = -5
XAER_PROTO = -6
XAER_RMFAIL = -7
XAER_DUPID = -8
XAER_OUTSIDE = -9

MAXGTRIDSIZE = 64
MAXBQUALSIZE = 64


@dataclass(frozen=True, slots=True)
class Xid:
    """A transaction branch id: format id, global transaction id, branch qualifier."""

    format_id: int
    gtrid: bytes
    bqual: bytes
    # computed once: a branch's Xid is hashed and printed (store key) several times per
    # transaction on a link's hot path
    _hash: int = field(init=False, repr=False, compare=False)
    _text: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.gtrid, bytes) or not isinstance(self.bqual, bytes):
            raise TypeError("Xid gtrid and bqual must be bytes")
        if not 1 <= len(self.gtrid) <= MAXGTRIDSIZE:
            raise ValueError(f"Xid gtrid must be 1..{MAXGTRIDSIZE} bytes")
        if len(self.bqual) > MAXBQUALSIZE:
            raise ValueError(f"Xid bqual must be at most {MAXBQUALSIZE} bytes")
        if not -(2**31) <= self.format_id < 2**31:
            raise ValueError("Xid format_id must fit in 32 bits")
        object.__setattr__(self, "_hash", hash((self.format_id, self.gtrid, self.bqual)))
        object.__setattr__(self, "_text", f"{self.format_id}:{self.gtrid.hex()}:{self.bqual.hex()}")

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return self._text

    @classmethod
    def parse(cls, text: str) -> Xid:
        """Inverse of ``str(xid)``."""
        fmt, gtrid, bqual = text.split(":")
        return cls(int(fmt), bytes.fromhex(gtrid), bytes.fromhex(bqual))
