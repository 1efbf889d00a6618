-- The model's tokens of an invocation, for the viewer: the prompt tokens (in) and completion
-- tokens (out) each model answer reported in its usage, summed over every model call of the
-- invocation (summary calls too). NULL until a call reports the count: a model that sends no
-- usage shows none, never a zero it did not say. Added without a default: no row is rewritten.
ALTER TABLE invocations ADD COLUMN tokens_in BIGINT;
ALTER TABLE invocations ADD COLUMN tokens_out BIGINT;
