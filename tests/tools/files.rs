//! files tool tests (being built).
