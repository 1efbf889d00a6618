//! Build script: the git revision podhost is built from, and link options for the
//! `podhost-exec` binary.
//!
//! * `BUILD_GIT_REVISION` (a compile-time variable): the commit the build comes from, for
//!   `podhost --version`, the start-up log and `/healthz`. Taken from `PODHOST_GIT_REVISION`
//!   when that is set in the build's environment
//!   (a build without `.git`, such as a container build given the revision as an argument),
//!   else from `git rev-parse HEAD`, else `unknown`. Uncommitted changes are not marked: that
//!   would rebuild the crate at every `git add`.
//! * `podhost-exec` is the command supervisor: about 1 MB of code, but linking it pulls whole
//!   codegen units of the library and its dependencies, and with them their line tables — some
//!   45 MB of debug info in a release build, shipped in every image for a program that reports
//!   its failures as status lines rather than backtraces. Release builds strip it; debug builds
//!   keep it for debuggers.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn revision() -> String {
    println!("cargo::rerun-if-env-changed=PODHOST_GIT_REVISION");
    if let Ok(rev) = std::env::var("PODHOST_GIT_REVISION")
        && !rev.trim().is_empty()
    {
        return rev.trim().to_owned();
    }
    // Rebuild when HEAD moves: HEAD itself, the branch it names, and the packed refs (only
    // files that exist: cargo reruns the script every time for a missing one).
    let watch = |path: String| {
        if std::path::Path::new(&path).exists() {
            println!("cargo::rerun-if-changed={path}");
        }
    };
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        watch(format!("{dir}/HEAD"));
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        watch(format!("{common}/packed-refs"));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watch(format!("{common}/{branch}"));
        }
    }
    git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // Not named PODHOST_…: cargo also sets this variable in the processes it runs (`cargo
    // test`), where a PODHOST_ name would read as one of podhost's settings.
    println!("cargo::rustc-env=BUILD_GIT_REVISION={}", revision());
    if std::env::var("PROFILE").as_deref() == Ok("release") {
        println!("cargo::rustc-link-arg-bin=podhost-exec=-Wl,--strip-debug");
    }
}
