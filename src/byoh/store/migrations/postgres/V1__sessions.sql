-- Invocations and their transcripts (the same shape as the SQLite store's first version).
CREATE TABLE invocations (
    invocation_id TEXT PRIMARY KEY,
    session_id    TEXT NOT NULL UNIQUE,
    status        TEXT NOT NULL,
    error         TEXT,
    connection    TEXT NOT NULL,
    needs_key     BOOLEAN NOT NULL,
    output_start  BIGINT NOT NULL,
    pending       TEXT NOT NULL DEFAULT '[]',
    last_resume   TEXT NOT NULL DEFAULT '[]',
    created_ms    BIGINT NOT NULL,
    updated_ms    BIGINT NOT NULL,
    finished_ms   BIGINT,
    swept         BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX invocations_status ON invocations (status, swept);
CREATE TABLE messages (
    invocation_id TEXT NOT NULL,
    seq           BIGINT NOT NULL,
    body          TEXT NOT NULL,
    PRIMARY KEY (invocation_id, seq)
);
