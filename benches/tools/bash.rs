//! bash tool vs bare `bash -c true` (being built).
pub fn main() {}
