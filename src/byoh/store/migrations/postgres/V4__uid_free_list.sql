-- The uid pool as a free list, so that handing out a uid costs the same for every session: uids
-- given back (a swept session's) are served lowest first, then each range's next uid never yet
-- handed out. The order in which sessions last took their uid (`used`, rising with every take)
-- says which idle session lends its uid, least recently used first, once the pool has no other.
CREATE TABLE uid_free (
    uid BIGINT PRIMARY KEY
);
CREATE TABLE uid_next (
    first BIGINT PRIMARY KEY,
    next  BIGINT NOT NULL
);
ALTER TABLE session_uids ADD COLUMN used BIGINT NOT NULL DEFAULT 0;
CREATE INDEX session_uids_by_use ON session_uids (used);
CREATE SEQUENCE uid_use;
-- Replicas' liveness: each replica holds an advisory lock (class 1886348291, key its
-- `lock_key`) on a connection of its own for as long as it lives; the server releases it the
-- moment that connection ends. A turn's lease that ran out is taken over only while its
-- owner's lock is not held, so a live replica that missed its renewals (a busy machine, a
-- pause) keeps its turns.
CREATE TABLE replicas (
    owner      TEXT PRIMARY KEY,
    lock_key   INTEGER NOT NULL UNIQUE,
    started_ms BIGINT NOT NULL
);
CREATE SEQUENCE replica_lock_key AS INTEGER MINVALUE 1 CYCLE;
CREATE FUNCTION podhost_alive(who TEXT) RETURNS BOOLEAN
    AS $$ SELECT EXISTS (SELECT 1 FROM replicas r JOIN pg_locks l
        ON l.locktype = 'advisory' AND l.classid = 1886348291 AND l.objid = r.lock_key::oid
        AND l.objsubid = 2 AND l.granted
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        WHERE r.owner = who) $$
    LANGUAGE SQL STABLE;
