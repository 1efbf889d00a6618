-- The store as it was before versioned migrations: invocations and their transcripts.
-- `IF NOT EXISTS`, so a store written before migrations were versioned adopts this history.
CREATE TABLE IF NOT EXISTS invocations (
    invocation_id TEXT PRIMARY KEY,
    session_id    TEXT NOT NULL UNIQUE,
    status        TEXT NOT NULL,
    error         TEXT,
    connection    TEXT NOT NULL,
    needs_key     INTEGER NOT NULL,
    output_start  INTEGER NOT NULL,
    pending       TEXT NOT NULL DEFAULT '[]',
    last_resume   TEXT NOT NULL DEFAULT '[]',
    created_ms    INTEGER NOT NULL,
    updated_ms    INTEGER NOT NULL,
    finished_ms   INTEGER,
    swept         INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS invocations_status ON invocations (status, swept);
CREATE TABLE IF NOT EXISTS messages (
    invocation_id TEXT NOT NULL,
    seq           INTEGER NOT NULL,
    body          TEXT NOT NULL,
    PRIMARY KEY (invocation_id, seq)
) WITHOUT ROWID;
