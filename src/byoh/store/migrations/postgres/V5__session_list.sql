-- The viewer's list of sessions, newest first, a page at a time (keyset paging on when an
-- invocation started, its id breaking ties): an index in that order, so that a page costs the
-- same whatever the number of sessions.
CREATE INDEX invocations_by_start ON invocations (created_ms, invocation_id);
