//! Tool benchmarks against rg, fd and bash (being built).
fn main() {}
