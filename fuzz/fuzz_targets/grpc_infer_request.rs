//! The gRPC `ModelInferRequest` → internal `InferRequest` conversion: arbitrary bytes through
//! prost's decoder, then `nereid_proto::codec::decode_request` (typed and raw contents,
//! parameters and reserved options, shared-memory references, which it then refuses for want
//! of a registry, requested outputs).
//!
//! Property beyond "no panic": the router re-encodes what it decoded to forward it to a
//! worker, so a decoded request (without shared memory) must survive encode → decode unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nereid_proto::InferRequest;
use nereid_proto::codec::{decode_request, encode_request};
use nereid_proto::pb::inference::ModelInferRequest;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Ok(wire) = ModelInferRequest::decode(data) else {
        return;
    };
    let Ok(mut request) = decode_request(wire) else {
        return;
    };
    let forwarded = encode_request(&request).expect("a decoded gRPC request encodes");
    let again = decode_request(forwarded).expect("an encoded request decodes");
    forget_flags_without_sequence(&mut request);
    // Debug text, not ==: a NaN double parameter is the same request but not equal to itself.
    assert_eq!(
        format!("{again:?}"),
        format!("{request:?}"),
        "a gRPC request changed on its way through the router's codec"
    );
});

/// `sequence_start` / `sequence_end` mean something only with a `sequence_id` (the data plane
/// reads them only through a correlation ID, and refuses a sequence model's request without
/// one), so the encoder leaves them out without an id, as a client would.
fn forget_flags_without_sequence(request: &mut InferRequest) {
    if request.options.sequence_id.is_none() {
        request.options.sequence_start = false;
        request.options.sequence_end = false;
    }
}
