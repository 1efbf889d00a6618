//! bash tool tests (being built).
