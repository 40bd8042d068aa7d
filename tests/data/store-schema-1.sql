-- The SQLite store's tables at schema version 1 (bridgemgr/providers/embedded/store.py
-- before durable subscriptions had owners): tests/test_store_upgrade.py builds a store of it.
CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS msgs(seq INTEGER PRIMARY KEY, qkey TEXT NOT NULL,
                                dcount INTEGER NOT NULL DEFAULT 0, blob BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS subs(client_id TEXT NOT NULL, name TEXT NOT NULL, topic TEXT NOT NULL,
                                selector TEXT, no_local INTEGER NOT NULL,
                                PRIMARY KEY(client_id, name));
CREATE TABLE IF NOT EXISTS dests(qkey TEXT PRIMARY KEY, config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS xa(xid TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS xa_sends(xid TEXT NOT NULL, seq INTEGER NOT NULL, qkey TEXT NOT NULL,
                                    blob BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS xa_acks(xid TEXT NOT NULL, seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS msgs_qkey ON msgs(qkey, seq);
CREATE INDEX IF NOT EXISTS xa_sends_xid ON xa_sends(xid);
CREATE INDEX IF NOT EXISTS xa_acks_xid ON xa_acks(xid);
