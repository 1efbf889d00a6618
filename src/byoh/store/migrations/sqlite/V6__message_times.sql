-- When each message was stored (ms since the epoch), for the viewer's timeline of a turn: a
-- message is stored as it is made (a model's answer when the call returns, a tool's result when
-- the call ends). Messages stored before this version have none.
ALTER TABLE messages ADD COLUMN at_ms INTEGER;
