//! With the `torch` feature, bakes libtorch's directory into the RUNPATH of this crate's test
//! and example binaries, so they run without `LD_LIBRARY_PATH` (the `nereid` binary gets the
//! same from the workspace's build.rs). The directory is `$LIBTORCH/lib` (what torch-sys
//! builds against), else the one `make setup` recorded in `.venv/libtorch-path`.

fn main() {
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
