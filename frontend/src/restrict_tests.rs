//! Tests of `restrict`: the flag parser, the category of every endpoint, and the check.

use http::{HeaderMap, HeaderValue};

use super::*;
use crate::http::routes::{http_category, parse_route};

fn values(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.append(*k, HeaderValue::from_static(v));
    }
    map
}

#[test]
fn one_value_restricts_each_api_it_lists() {
    let r = RestrictedApis::parse_http(&values(&["model-repository, statistics:admin-key=s3"]))
        .unwrap();
    for c in [ApiCategory::ModelRepository, ApiCategory::Statistics] {
        let rule = r.required(c).unwrap();
        assert_eq!(
            (rule.key.as_str(), rule.value.as_str()),
            ("admin-key", "s3")
        );
    }
    assert!(r.required(ApiCategory::Inference).is_none());
    assert!(RestrictedApis::parse_http(&[]).unwrap().is_empty());
}

#[test]
fn grpc_keys_get_the_metadata_prefix() {
    let r = RestrictedApis::parse_grpc(&values(&["inference:infer-key=k", "health:h=1"])).unwrap();
    assert_eq!(
        r.required(ApiCategory::Inference).unwrap().key,
        "triton-grpc-protocol-infer-key"
    );
    assert_eq!(
        r.required(ApiCategory::Health).unwrap().key,
        "triton-grpc-protocol-h"
    );
}

#[test]
fn a_value_may_contain_colons_and_equals_signs() {
    let r = RestrictedApis::parse_http(&values(&["logging:k=a:b=c"])).unwrap();
    assert_eq!(r.required(ApiCategory::Logging).unwrap().value, "a:b=c");
}

#[test]
fn bad_values_name_the_flag_and_what_is_wrong() {
    let err = |v: &str| {
        RestrictedApis::parse_http(&values(&[v]))
            .unwrap_err()
            .to_string()
    };
    let e = err("inference");
    assert!(
        e.starts_with("--http-restricted-api 'inference' is malformed: no ':'"),
        "{e}"
    );
    assert!(e.contains("<api>[,<api>...]:<key>=<value>"), "{e}");
    assert!(err("inference:key").contains("no '='"));
    assert!(err(":k=v").contains("no API is named"));
    assert!(err("inference:=v").contains("the header name is empty"));
    assert!(err("inference:bad key=v").contains("'bad key' is not a valid header name"));
    let e = err("inference,metrics:k=v");
    assert_eq!(
        e,
        "--http-restricted-api 'inference,metrics:k=v': unknown API 'metrics'; the APIs are health, metadata, inference, shared-memory, model-config, model-repository, statistics, trace, logging, openai"
    );
    let e = RestrictedApis::parse_grpc(&values(&["health:a=1", "metadata,health:b=2"]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "--grpc-restricted-protocol: API 'health' is restricted in more than one --grpc-restricted-protocol value; each API can be in one only"
    );
}

#[test]
fn the_check_wants_the_exact_value_and_ignores_the_name_case() {
    let r = RestrictedApis::parse_http(&values(&["inference:Admin-Key=Secret"])).unwrap();
    let c = ApiCategory::Inference;
    assert_eq!(r.check(c, &headers(&[("admin-key", "Secret")])), Ok(()));
    assert_eq!(
        r.check(c, &headers(&[("admin-key", "x"), ("admin-key", "Secret")])),
        Ok(())
    );
    let missing = r
        .check(c, &headers(&[("admin-key", "secret")]))
        .unwrap_err();
    assert_eq!(
        http_refusal(missing),
        "This API is restricted, expecting header 'Admin-Key'"
    );
    assert!(r.check(c, &HeaderMap::new()).is_err());
    // Other categories are open.
    assert_eq!(r.check(ApiCategory::Health, &HeaderMap::new()), Ok(()));

    let g = RestrictedApis::parse_grpc(&values(&["inference:k=v"])).unwrap();
    let missing = g.check(c, &HeaderMap::new()).unwrap_err();
    assert_eq!(
        grpc_refusal(missing),
        "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
    );
    assert_eq!(
        g.check(c, &headers(&[("triton-grpc-protocol-k", "v")])),
        Ok(())
    );
}

#[test]
fn http_routes_fall_in_triton_categories() {
    let cat = |path: &str| http_category(&parse_route(path).unwrap());
    let cases = [
        ("/v2/health/live", ApiCategory::Health),
        ("/v2/health/ready", ApiCategory::Health),
        ("/v2/models/m/ready", ApiCategory::Health),
        ("/v2", ApiCategory::Metadata),
        ("/v2/models/m", ApiCategory::Metadata),
        ("/v2/models/m/versions/2", ApiCategory::Metadata),
        ("/v2/models/m/infer", ApiCategory::Inference),
        ("/v2/models/m/generate", ApiCategory::Inference),
        ("/v2/models/m/generate_stream", ApiCategory::Inference),
        ("/v2/models/m/config", ApiCategory::ModelConfig),
        ("/v2/models/m/stats", ApiCategory::Statistics),
        ("/v2/models/stats", ApiCategory::Statistics),
        ("/v2/repository/index", ApiCategory::ModelRepository),
        ("/v2/repository/models/m/load", ApiCategory::ModelRepository),
        (
            "/v2/repository/models/m/unload",
            ApiCategory::ModelRepository,
        ),
        ("/v2/systemsharedmemory/status", ApiCategory::SharedMemory),
        (
            "/v2/cudasharedmemory/region/r/register",
            ApiCategory::SharedMemory,
        ),
        ("/v2/trace/setting", ApiCategory::Trace),
        ("/v2/models/m/trace/setting", ApiCategory::Trace),
        ("/v2/logging", ApiCategory::Logging),
    ];
    for (path, expected) in cases {
        assert_eq!(cat(path), expected, "{path}");
    }
}

#[test]
fn grpc_methods_fall_in_triton_categories() {
    let svc = |m: &str| grpc_category(&format!("/inference.GRPCInferenceService/{m}"));
    let cases = [
        ("ServerLive", ApiCategory::Health),
        ("ServerReady", ApiCategory::Health),
        ("ModelReady", ApiCategory::Health),
        ("ServerMetadata", ApiCategory::Metadata),
        ("ModelMetadata", ApiCategory::Metadata),
        ("ModelInfer", ApiCategory::Inference),
        ("ModelStreamInfer", ApiCategory::Inference),
        ("ModelConfig", ApiCategory::ModelConfig),
        ("ModelStatistics", ApiCategory::Statistics),
        ("RepositoryIndex", ApiCategory::ModelRepository),
        ("RepositoryModelLoad", ApiCategory::ModelRepository),
        ("RepositoryModelUnload", ApiCategory::ModelRepository),
        ("SystemSharedMemoryStatus", ApiCategory::SharedMemory),
        ("SystemSharedMemoryRegister", ApiCategory::SharedMemory),
        ("SystemSharedMemoryUnregister", ApiCategory::SharedMemory),
        ("CudaSharedMemoryStatus", ApiCategory::SharedMemory),
        ("CudaSharedMemoryRegister", ApiCategory::SharedMemory),
        ("CudaSharedMemoryUnregister", ApiCategory::SharedMemory),
        ("TraceSetting", ApiCategory::Trace),
        ("LogSettings", ApiCategory::Logging),
    ];
    for (method, expected) in cases {
        assert_eq!(svc(method), Some(expected), "{method}");
    }
    assert_eq!(
        grpc_category("/grpc.health.v1.Health/Check"),
        Some(ApiCategory::Health)
    );
    assert_eq!(svc("NoSuchRpc"), None);
    assert_eq!(grpc_category("/other.Service/ModelInfer"), None);
    assert_eq!(grpc_category("nonsense"), None);
}
