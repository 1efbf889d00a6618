-- Turns run under a lease: the replica that owns it, an epoch every claim increments (each
-- write of a turn carries it), and when the lease runs out unless renewed (ms since the epoch).
ALTER TABLE invocations ADD COLUMN owner TEXT;
ALTER TABLE invocations ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
ALTER TABLE invocations ADD COLUMN lease_until_ms INTEGER;
-- One uid per live session, unique across replicas.
CREATE TABLE session_uids (
    uid        INTEGER PRIMARY KEY,
    session_id TEXT NOT NULL UNIQUE,
    owner      TEXT NOT NULL,
    claimed_ms INTEGER NOT NULL
);
