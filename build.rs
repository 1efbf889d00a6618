//! Build script: link options for the `podhost-exec` binary only.
//!
//! `podhost-exec` is the command supervisor: about 1 MB of code, but linking it pulls whole
//! codegen units of the library and its dependencies, and with them their line tables — some
//! 45 MB of debug info in a release build, shipped in every image for a program that reports
//! its failures as status lines rather than backtraces. Release builds strip it; debug builds
//! keep it for debuggers.

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        println!("cargo::rustc-link-arg-bin=podhost-exec=-Wl,--strip-debug");
    }
}
