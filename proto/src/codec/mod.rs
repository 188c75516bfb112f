//! The gRPC codec, both directions, in one place: KServe v2 protobuf messages ⇄ the internal
//! request and response, and [`tonic::Status`] ⇄ [`ServiceError`](crate::ServiceError).
//!
//! ```text
//!                 gRPC frontend (nereid-frontend)          router forwarder (nereid-router)
//!  client ──ModelInferRequest──► decode_request            encode_request ──ModelInferRequest──► worker
//!  client ◄─ModelInferResponse── encode_response           decode_response ◄─ModelInferResponse── worker
//!  client ◄─Status────────────── Status::from(ServiceError) ServiceError::from(Status) ◄─Status── worker
//! ```
//!
//! - `request`: `ModelInferRequest` ⇄ `InferRequest` (parameters, typed and raw contents).
//! - `response`: `InferResponse` ⇄ `ModelInferResponse` (raw outputs, uncopied).
//! - `status`: error class ⇄ gRPC code, one exhaustive `match` each way.
//! - `contents`: typed `InferTensorContents` ─► raw little-endian bytes.
//! - `parameters`: one `InferParameter` ⇄ one `ParamValue`.
//! - `limits`: [`RequestLimits`], the request-level bounds (input / output counts, elements of
//!   one tensor) that the gRPC decoder here and the HTTP decoder of `nereid-frontend` both check
//!   before any tensor data is decoded.
//!
//! Tensor bytes are `Bytes` from prost decoding to the service and back, never copied. Call
//! metadata (trace context, `grpc-timeout`) is not part of the message and stays with the
//! transport code that reads or writes it.

mod contents;
mod limits;
mod parameters;
mod request;
mod response;
mod status;

pub use limits::RequestLimits;
pub use request::{
    StreamRequest, decode_request, decode_stream_request, encode_request, version_text,
};
pub use response::{decode_response, encode_response};
