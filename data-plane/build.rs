//! Records where this build's own shared libraries are — `libnereid_stub_core.so` (the Python
//! stub's core) and `libnereid_torch_backend.so` (the PyTorch backend), cdylibs of the same
//! target directory and profile — as `NEREID_BUILD_PROFILE_DIR`, the server's last place to
//! look when no copy lies next to its executable or in /opt/nereid (backend/library_path.rs).

#[allow(
    clippy::expect_used,
    reason = "cargo always sets OUT_DIR for build scripts"
)]
fn main() {
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is <target>/<profile>/build/<crate>-<hash>/out.
    if let Some(profile_dir) = out.ancestors().nth(3) {
        println!(
            "cargo:rustc-env=NEREID_BUILD_PROFILE_DIR={}",
            profile_dir.display()
        );
    }
}
