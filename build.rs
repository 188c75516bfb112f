//! Records where `make setup` put the ONNX Runtime library (`.venv/ort-lib-path`), so the
//! binary finds it without environment variables; with the `torch` feature, also bakes
//! libtorch's directory into the binary's RUNPATH (see data-plane/build.rs).

fn main() {
    let marker = std::path::Path::new(".venv/ort-lib-path");
    println!("cargo:rerun-if-changed={}", marker.display());
    if let Ok(path) = std::fs::read_to_string(marker) {
        println!("cargo:rustc-env=NEREID_BUILTIN_ORT_LIBRARY={}", path.trim());
    }
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_some()
        && let Some(lib) = libtorch_lib(std::path::Path::new(".venv/libtorch-path"))
    {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    }
}

/// `$LIBTORCH/lib`, or the `lib` directory under the path `make setup` recorded.
fn libtorch_lib(marker: &std::path::Path) -> Option<String> {
    println!("cargo:rerun-if-changed={}", marker.display());
    let root = std::env::var("LIBTORCH")
        .ok()
        .or_else(|| std::fs::read_to_string(marker).ok())?;
    Some(format!("{}/lib", root.trim()))
}
