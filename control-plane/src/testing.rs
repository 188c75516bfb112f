//! Fixtures shared by the crate's unit tests: a valid model spec and a valid node spec that
//! each test adjusts with struct-update syntax.

use std::collections::BTreeMap;

use crate::state::{
    Gpu, ModelSpec, NodeAddresses, NodeCapacity, NodeSpec, Resources, VersionPolicy,
};

/// `name` from `file:///models/{name}`: latest 1 of versions 1 and 2, 1..2 replicas, 1 GiB.
pub fn model(name: &str) -> ModelSpec {
    ModelSpec {
        name: name.to_string(),
        source: format!("file:///models/{name}"),
        version_policy: VersionPolicy::Latest { n: 1 },
        config_override: None,
        min_replicas: 1,
        max_replicas: 2,
        resources: Resources {
            cpu_millis: 500,
            memory_bytes: 1 << 30,
            gpus: 0,
            gpu_memory_bytes: 0,
        },
        labels: BTreeMap::new(),
        available_versions: vec![1, 2],
        traffic: Default::default(),
    }
}

/// `id` with 8 CPUs, 32 GiB and one 80 GiB GPU, up and undrained.
pub fn node(id: &str) -> NodeSpec {
    NodeSpec {
        id: id.to_string(),
        addresses: NodeAddresses {
            data_http: format!("{id}:8000"),
            data_grpc: format!("{id}:8001"),
            agent: format!("{id}:8003"),
        },
        capacity: NodeCapacity {
            cpu_millis: 8000,
            memory_bytes: 32 << 30,
            gpus: vec![Gpu {
                index: 0,
                memory_bytes: 80 << 30,
            }],
        },
        labels: BTreeMap::new(),
        drained: false,
    }
}
