-- The compacted view of a session's transcript: what the model is sent (a summary, the kept
-- messages, where the view's own messages start), one row per session, replaced when it changes.
CREATE TABLE contexts (
    invocation_id TEXT PRIMARY KEY,
    view          TEXT NOT NULL
) WITHOUT ROWID;
