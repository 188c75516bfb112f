//! The management REST API's request bodies (`/api/v1/...`): proto-JSON parsing into each
//! route's message, the path's name, the model validation and the registry's own checks of the
//! resulting command, through `nereid_control_plane::fuzzing::rest_request`, which also checks
//! that every accepted model and command round-trips (the GET form, the replicated log's JSON).
//!
//! Input: `<route>[ <path name>]\n<body>`, route one of `model`, `scale`, `traffic`, `member`,
//! `query` (the body is then a query string); an unknown route is skipped.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nereid_control_plane::fuzzing::{RestRoute, rest_request};

fuzz_target!(|data: &[u8]| {
    let Some(at) = data.iter().position(|&b| b == b'\n') else {
        return;
    };
    let Ok(line) = std::str::from_utf8(&data[..at]) else {
        return;
    };
    let (route, path) = match line.split_once(' ') {
        Some((route, path)) => (route, Some(path)),
        None => (line, None),
    };
    let route = match route {
        "model" => RestRoute::DeployModel,
        "scale" => RestRoute::ScaleModel,
        "traffic" => RestRoute::SetTraffic,
        "member" => RestRoute::AddMember,
        "query" => RestRoute::ReadQuery,
        _ => return,
    };
    let _ = rest_request(route, path, &data[at + 1..]);
});
