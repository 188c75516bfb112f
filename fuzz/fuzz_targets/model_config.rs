//! `config.pbtxt` text → `ModelConfig` → `ValidModelConfig`: the text-format parser, platform
//! and backend filling, Triton's defaults, validation and typing, through
//! `nereid_data_plane::fuzzing::model_config_text`.
//!
//! Property beyond "no panic": the server answers `/config` (and hands a Python model's
//! `initialize`) the valid config as JSON, which must read back as the same config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::{message_from_json, message_to_json};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(valid) = nereid_data_plane::fuzzing::model_config_text(text) else {
        return;
    };
    let json = message_to_json(valid.wire()).to_string();
    let back: ModelConfig = message_from_json(&json).expect("a valid config's JSON reads back");
    // `==` compares map fields as maps (their Debug order varies); a NaN float field is the
    // same config but unequal to itself, so a real change must also show in the JSON.
    let same = back == *valid.wire() || message_to_json(&back) == message_to_json(valid.wire());
    assert!(
        same,
        "a valid config changed through its JSON form: {:?} became {back:?}",
        valid.wire()
    );
});
