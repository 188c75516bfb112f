//! Protobuf messages to and from JSON the way Triton prints them: snake_case proto field names,
//! every primitive field present even when default, enums by name, 64-bit integers as JSON
//! numbers (not strings). Also the text-format (`config.pbtxt`) parser's entry point.
//!
//! prost types carry no reflection of their own; each is found in [`DESCRIPTOR_POOL`] by its
//! `prost::Name` and converted through a [`DynamicMessage`].

use prost::{Message, Name};
use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};

use crate::pb::DESCRIPTOR_POOL;

/// The reflection descriptor of a generated message type.
#[allow(
    clippy::expect_used,
    reason = "the pool is built from the same protos as the generated types"
)]
pub fn descriptor<M: Name>() -> MessageDescriptor {
    DESCRIPTOR_POOL
        .get_message_by_name(&M::full_name())
        .expect("every generated message is in the descriptor pool")
}

/// Views a generated message as a [`DynamicMessage`].
#[allow(
    clippy::expect_used,
    reason = "a message's own encoding decodes with its own descriptor"
)]
pub fn to_dynamic<M: Message + Name>(message: &M) -> DynamicMessage {
    DynamicMessage::decode(descriptor::<M>(), message.encode_to_vec().as_slice())
        .expect("a message decodes with its own descriptor")
}

/// Serializes a message to Triton-style JSON.
pub fn message_to_json<M: Message + Name>(message: &M) -> serde_json::Value {
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    to_dynamic(message)
        .serialize_with_options(serde_json::value::Serializer, &options)
        .unwrap_or(serde_json::Value::Null)
}

/// Parses protobuf JSON (field names in either case; unknown fields refused) into a message.
pub fn message_from_json<M: Message + Name + Default>(text: &str) -> Result<M, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let dynamic = DynamicMessage::deserialize_with_options(descriptor::<M>(), &mut de, &options)
        .map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    dynamic.transcode_to::<M>().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::inference::{ModelConfig, ModelInput};

    #[test]
    fn config_prints_like_triton() {
        let config = ModelConfig {
            name: "m".into(),
            max_batch_size: 8,
            input: vec![ModelInput {
                name: "x".into(),
                data_type: 11,
                dims: vec![-1, 4],
                ..Default::default()
            }],
            ..Default::default()
        };
        let json = message_to_json(&config);
        assert_eq!(json["name"], "m");
        assert_eq!(json["max_batch_size"], 8);
        assert_eq!(json["input"][0]["data_type"], "TYPE_FP32");
        assert_eq!(json["input"][0]["dims"], serde_json::json!([-1, 4]));
        assert_eq!(json["platform"], "");
    }

    #[test]
    fn config_round_trips_through_json() {
        let text = r#"{"name":"m","max_batch_size":2,"input":[{"name":"x","data_type":"TYPE_INT32","dims":[3]}]}"#;
        let c: ModelConfig = message_from_json(text).unwrap();
        assert_eq!(c.input[0].dims, vec![3]);
        assert!(message_from_json::<ModelConfig>(r#"{"nme":"m"}"#).is_err());
    }
}
