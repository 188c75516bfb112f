//! Compiles the `.proto` files with protox (no system `protoc`) into `OUT_DIR`: prost types,
//! tonic services, and the encoded descriptor set the reflection pool (text-format config
//! parsing, proto-JSON output) is built from.

use prost::Message;

const PROTOS: &[&str] = &[
    "grpc_service.proto",
    "model_config.proto",
    "health.proto",
    "nereid_cluster.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let fds = protox::compile(PROTOS, ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("file_descriptor_set.bin"), fds.encode_to_vec())?;

    // `enable_type_names` implements `prost::Name`, which `crate::json` uses to find a message's
    // descriptor in the reflection pool.
    let mut config = prost_build::Config::new();
    config.enable_type_names();
    tonic_prost_build::configure()
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .bytes(".inference.InferTensorContents.bytes_contents")
        .compile_fds_with_config(fds, config)?;
    Ok(())
}
