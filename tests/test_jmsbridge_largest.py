"""largest.<link>: the size of a link's largest message, kept across restarts (largest.py)."""

from __future__ import annotations

import logging

from bridgemgr.jmsbridge.largest import LargestMessage, largest_path


def test_the_file_is_written_when_the_size_grows_by_more_than_an_eighth(tmp_path):
    """Sizes creeping up a byte at a time write the file a few times, not once per
    message; it holds the size plus an eighth, which a new LargestMessage reads."""
    path = largest_path(tmp_path / "bridges" / "jb", "l1")
    sizes = LargestMessage(path)
    assert sizes.size == 0 and not path.exists()
    writes = []
    for size in range(1000, 2001):
        sizes.saw(size)
        writes.append(path.read_text())
    assert sizes.size == 2000
    assert sorted(set(writes), key=writes.index) == [f"{n}\n" for n in (1125, 1266, 1425, 1604, 1805, 2031)]
    assert path.stat().st_mode & 0o777 == 0o600
    assert LargestMessage(path).size == 2031
    assert not LargestMessage(path).saw(2031)


def test_a_file_that_cannot_be_read_is_reported_and_left_out(tmp_path, caplog):
    path = largest_path(tmp_path, "l1")
    path.write_text("lots\n")
    with caplog.at_level(logging.WARNING):
        assert LargestMessage(path).size == 0
    assert str(path) in caplog.text and "'lots'" in caplog.text
