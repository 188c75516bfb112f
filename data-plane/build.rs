//! With the `torch` feature, bakes libtorch's directory into the RUNPATH of this crate's test
//! and example binaries, so they run without `LD_LIBRARY_PATH` (the `nereid` binary gets the
//! same from the workspace's build.rs). The directory is `$LIBTORCH/lib` (what torch-sys
//! builds against), else the one `make setup` recorded in `.venv/libtorch-path`.
//!
//! Also records where this build's Python stub core (`libnereid_stub_core.so`, the
//! `nereid-stub-core` cdylib of the same target directory and profile) is, the server's
//! fallback when no copy lies next to its executable (backend/python/stub_core.rs).

fn main() {
    stub_core_path();
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    let marker = std::path::Path::new("../.venv/libtorch-path");
    println!("cargo:rerun-if-changed={}", marker.display());
    let root = std::env::var("LIBTORCH")
        .ok()
        .or_else(|| std::fs::read_to_string(marker).ok());
    match root {
        Some(root) => println!("cargo:rustc-link-arg=-Wl,-rpath,{}/lib", root.trim()),
        None => println!(
            "cargo:warning=feature 'torch': neither LIBTORCH nor .venv/libtorch-path is set; binaries will need LD_LIBRARY_PATH"
        ),
    }
}

/// `NEREID_BUILTIN_STUB_CORE`: `<target>/<profile>/libnereid_stub_core.so` of this build.
#[allow(
    clippy::expect_used,
    reason = "cargo always sets OUT_DIR for build scripts"
)]
fn stub_core_path() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<crate>-<hash>/out.
    if let Some(profile_dir) = out.ancestors().nth(3) {
        println!(
            "cargo:rustc-env=NEREID_BUILTIN_STUB_CORE={}",
            profile_dir.join("libnereid_stub_core.so").display()
        );
    }
}
