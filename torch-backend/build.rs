//! Bakes libtorch's directory into the RUNPATH of `libnereid_torch_backend.so` and of this
//! crate's test and example binaries, so they find libtorch without `LD_LIBRARY_PATH`. The
//! directory is `$LIBTORCH/lib` (what torch-sys builds against), else the one `make setup`
//! recorded in `.venv/libtorch-path`.

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    let marker = std::path::Path::new("../.venv/libtorch-path");
    println!("cargo:rerun-if-changed={}", marker.display());
    let root = std::env::var("LIBTORCH")
        .ok()
        .or_else(|| std::fs::read_to_string(marker).ok());
    match root {
        Some(root) => println!("cargo:rustc-link-arg=-Wl,-rpath,{}/lib", root.trim()),
        None => println!(
            "cargo:warning=neither LIBTORCH nor .venv/libtorch-path is set; libnereid_torch_backend.so will need LD_LIBRARY_PATH to find libtorch"
        ),
    }
}
