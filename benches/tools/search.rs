//! grep tool vs rg, glob tool vs fd (being built).
pub fn main() {}
