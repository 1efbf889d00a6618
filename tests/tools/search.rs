//! search tool tests (being built).
