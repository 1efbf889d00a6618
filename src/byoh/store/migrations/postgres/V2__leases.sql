-- Turns run under a lease: the replica that owns it, an epoch every claim increments (each
-- write of a turn carries it), and when the lease runs out unless renewed (ms since the epoch,
-- by the database's clock, so replicas' clocks need not agree).
ALTER TABLE invocations ADD COLUMN owner TEXT;
ALTER TABLE invocations ADD COLUMN epoch BIGINT NOT NULL DEFAULT 0;
ALTER TABLE invocations ADD COLUMN lease_until_ms BIGINT;
CREATE FUNCTION podhost_now_ms() RETURNS BIGINT
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::BIGINT $$
    LANGUAGE SQL VOLATILE;
-- One uid per live session, unique across replicas.
CREATE TABLE session_uids (
    uid        BIGINT PRIMARY KEY,
    session_id TEXT NOT NULL UNIQUE,
    owner      TEXT NOT NULL,
    claimed_ms BIGINT NOT NULL
);
