//! The `config.pbtxt` text-format parser alone (`nereid_proto::parse_model_config`: list-colon
//! insertion, prost-reflect's text format, error positions), without the data plane, so it is
//! part of the light build `make test` runs. `model_config` adds completion and validation.
//!
//! Property beyond "no panic": a parsed config printed as JSON reads back as the same config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::{message_from_json, message_to_json, parse_model_config};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = parse_model_config(text) else {
        return;
    };
    let json = message_to_json(&config).to_string();
    let back: ModelConfig = message_from_json(&json).expect("a parsed config's JSON reads back");
    // `==` compares map fields as maps (their Debug order varies); a NaN float field is the
    // same config but unequal to itself, so a real change must also show in the JSON.
    let same = back == config || message_to_json(&back) == message_to_json(&config);
    assert!(
        same,
        "a parsed config changed through its JSON form: {config:?} became {back:?}"
    );
});
