//! Records where `make setup` put the ONNX Runtime library (`.venv/ort-lib-path`), so the
//! binary finds it without environment variables. libtorch is not linked: the PyTorch backend
//! is a library of its own (torch-backend/), opened on the first PyTorch model load.

fn main() {
    let marker = std::path::Path::new(".venv/ort-lib-path");
    println!("cargo:rerun-if-changed={}", marker.display());
    if let Ok(path) = std::fs::read_to_string(marker) {
        println!("cargo:rustc-env=NEREID_BUILTIN_ORT_LIBRARY={}", path.trim());
    }
}
