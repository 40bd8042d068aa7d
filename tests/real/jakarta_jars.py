"""A jakarta.jms build of a javax.jms provider, for testing the jakarta flavour against a
real broker: every javax/jms reference in the jars (class-file constant pools, entry names,
service files) renamed to jakarta/jms, which is what a Jakarta EE 9 migration of a client
library does. Class files are rewritten by parsing their constant pool (the only place a
class names other classes), so lengths and indices stay consistent."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

RENAMES = ((b"javax/jms/", b"jakarta/jms/"), (b"javax.jms.", b"jakarta.jms."))
# constant pool tag -> size of its payload (Utf8, tag 1, is variable)
SIZES = {3: 4, 4: 4, 5: 8, 6: 8, 7: 2, 8: 2, 9: 4, 10: 4, 11: 4, 12: 4, 15: 3, 16: 2, 17: 4, 18: 4, 19: 2, 20: 2}


def rename(text: bytes) -> bytes:
    for old, new in RENAMES:
        text = text.replace(old, new)
    return text


def rename_class(data: bytes) -> bytes:
    """A class file with javax.jms renamed in its constant pool."""
    if data[:4] != b"\xca\xfe\xba\xbe":
        raise ValueError("not a class file")
    count = struct.unpack_from(">H", data, 8)[0]
    out, pos, index = bytearray(data[:10]), 10, 1
    while index < count:
        tag = data[pos]
        if tag == 1:
            length = struct.unpack_from(">H", data, pos + 1)[0]
            text = rename(data[pos + 3 : pos + 3 + length])
            out += bytes([1]) + struct.pack(">H", len(text)) + text
            pos += 3 + length
        else:
            out += data[pos : pos + 1 + SIZES[tag]]
            pos += 1 + SIZES[tag]
            index += tag in (5, 6)  # longs and doubles take two slots
        index += 1
    return bytes(out + data[pos:])


def rename_jar(source: str | Path, target: Path) -> Path:
    """``source`` with javax.jms renamed to jakarta.jms everywhere; signatures dropped."""
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            name = item.filename
            if name.startswith("META-INF/") and name.endswith((".SF", ".RSA", ".DSA")):
                continue
            data = zin.read(item)
            if name.endswith(".class"):
                data = rename_class(data)
            elif name.startswith("META-INF/services/"):
                data = rename(data)
            zout.writestr(rename(name.encode()).decode(), data)
    return target
