-- The viewer's list of sessions, newest first, a page at a time (keyset paging on when an
-- invocation started, its id breaking ties): indexes in that order, over all sessions and
-- within one status, so that a page starts where the page before ended whatever the number of
-- sessions.
CREATE INDEX invocations_by_start ON invocations (created_ms, invocation_id);
CREATE INDEX invocations_by_status_start ON invocations (status, created_ms, invocation_id);
