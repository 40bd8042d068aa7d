"""The built-in XA transaction coordinator of JMS bridges (the chapter's "Transactional
Message Transfer"): coordinator.py (Xids, two-phase commit, branch states), txlog.py (the
transaction log file and its record format), sqllog.py (the same log in a database table),
recovery.py (in-doubt branches at start), registry.py (resource manager registration and
what a running bridge holds)."""
