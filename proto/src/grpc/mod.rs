//! gRPC frontend.
