-- When each message was stored (ms since the epoch, the store's clock), for the viewer's
-- timeline of a turn: a message is stored as it is made (a model's answer when the call
-- returns, a tool's result when the call ends). Messages stored before this version have none
-- (the column is added without a default, so no row is rewritten; new rows get the default).
ALTER TABLE messages ADD COLUMN at_ms BIGINT;
ALTER TABLE messages ALTER COLUMN at_ms SET DEFAULT podhost_now_ms();
