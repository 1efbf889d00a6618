-- The uid pool as a free list, so that handing out a uid costs the same for every session: uids
-- given back (a swept session's) are served lowest first, then each range's next uid never yet
-- handed out. The order in which sessions last took their uid (`used`, rising with every take)
-- says which idle session lends its uid, least recently used first, once the pool has no other.
CREATE TABLE uid_free (
    uid INTEGER PRIMARY KEY
);
CREATE TABLE uid_next (
    first INTEGER PRIMARY KEY,
    next  INTEGER NOT NULL
);
ALTER TABLE session_uids ADD COLUMN used INTEGER NOT NULL DEFAULT 0;
CREATE INDEX session_uids_by_use ON session_uids (used);
