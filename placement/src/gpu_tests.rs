//! GPU placement on synthetic GPU inventories: fits or not, no over-commit across models,
//! multi-GPU models, spread, re-placement after a node loss, and the explanations.

use super::tests::{GIB, model, node, replica};
use super::*;

fn gpu_node(id: &str, gpus_gib: &[u64]) -> NodeView {
    let mut n = node(id, 64);
    n.gpus = gpus_gib
        .iter()
        .enumerate()
        .map(|(i, gib)| GpuView {
            index: i as u32,
            memory_bytes: gib * GIB,
        })
        .collect();
    n
}

fn gpu_model(name: &str, wanted: u32, gpus: u32, gib_per_gpu: u64) -> ModelView {
    let mut m = model(name, wanted, 1);
    m.gpus = gpus;
    m.gpu_memory_estimate_bytes = gib_per_gpu * GIB;
    m
}

fn on_gpus(id: u64, model: &str, node: &str, gpus: &[u32]) -> CurrentReplica {
    let mut r = replica(id, model, node, true);
    r.gpus = gpus.to_vec();
    r
}

fn placed(p: &Plan) -> Vec<(&str, &str, Vec<u32>)> {
    p.add
        .iter()
        .map(|a| (a.model.as_str(), a.node.as_str(), a.gpus.clone()))
        .collect()
}

#[test]
fn a_gpu_model_goes_to_a_node_with_a_gpu_that_has_room() {
    // "a" has the most host memory but no GPU; "b"'s only GPU is too small.
    let mut a = node("a", 128);
    a.gpus.clear();
    let nodes = [a, gpu_node("b", &[2]), gpu_node("c", &[8, 16])];
    let p = plan(&nodes, &[gpu_model("m", 1, 1, 3)], &[], &Load::default());
    assert_eq!(
        placed(&p),
        [("m", "c", vec![1])],
        "the GPU with most free memory"
    );
    assert_eq!(
        p.add[0].skipped,
        [
            "node a: no GPU",
            "node b: GPU 0 has 2.0 GiB free, needs 3.0 GiB"
        ]
    );
    let why = p.explain().join("\n");
    assert!(why.contains("GPU(s) 1"), "{why}");
    assert!(why.contains("skipped node a: no GPU"), "{why}");
}

#[test]
fn a_gpu_model_that_fits_no_gpu_is_unplaced_with_each_node_explained() {
    let nodes = [node("a", 64), gpu_node("b", &[2, 1])];
    let p = plan(&nodes, &[gpu_model("m", 1, 1, 3)], &[], &Load::default());
    assert!(p.add.is_empty());
    assert_eq!(p.unplaced.len(), 1);
    let Reason::NoGpuCapacity {
        gpus,
        needed_per_gpu,
        skipped,
    } = &p.unplaced[0].reason
    else {
        panic!("{:?}", p.unplaced[0].reason)
    };
    assert_eq!((*gpus, *needed_per_gpu), (1, 3 * GIB));
    assert_eq!(
        skipped,
        &[
            "node a: no GPU",
            "node b: GPU 0 has 2.0 GiB free, needs 3.0 GiB"
        ]
    );
    assert_eq!(p.unplaced[0].reason.rule(), "NoGpuCapacity");
}

#[test]
fn host_memory_still_applies_to_gpu_models() {
    let nodes = [gpu_node("a", &[80])];
    let mut m = gpu_model("m", 1, 1, 1);
    m.memory_estimate_bytes = 100 * GIB;
    let p = plan(&nodes, &[m], &[], &Load::default());
    assert!(matches!(p.unplaced[0].reason, Reason::NoCapacity { .. }));
}

#[test]
fn gpus_are_never_overcommitted_across_several_models() {
    // One 10 GiB GPU: 4 + 4 fit, the third 4 GiB model does not; a 2 GiB one still does.
    let nodes = [gpu_node("a", &[10])];
    let models = [
        gpu_model("m1", 1, 1, 4),
        gpu_model("m2", 1, 1, 4),
        gpu_model("m3", 1, 1, 4),
        gpu_model("small", 1, 1, 2),
    ];
    let p = plan(&nodes, &models, &[], &Load::default());
    let names: Vec<&str> = p.add.iter().map(|a| a.model.as_str()).collect();
    assert_eq!(names, ["m1", "m2", "small"]);
    assert_eq!(p.unplaced.len(), 1);
    assert_eq!(p.unplaced[0].model, "m3");
    let why = p.unplaced[0].reason.to_string();
    assert!(
        why.contains("node a: GPU 0 has 2.0 GiB free, needs 4.0 GiB"),
        "{why}"
    );
}

#[test]
fn replicas_already_on_a_gpu_hold_its_memory_measured_first() {
    let nodes = [gpu_node("a", &[10, 10])];
    let models = [gpu_model("big", 1, 1, 2), gpu_model("new", 1, 1, 5)];
    // "big" is estimated at 2 GiB but its replica measured 7 GiB on GPU 1.
    let mut existing = on_gpus(1, "big", "a", &[1]);
    existing.gpu_memory_bytes = Some(7 * GIB);
    let p = plan(&nodes, &models, &[existing.clone()], &Load::default());
    assert_eq!(placed(&p), [("new", "a", vec![0])]);

    // Both GPUs partly used: nothing with 5 GiB free is left.
    let mut other = on_gpus(2, "new-old", "a", &[0]);
    other.gpu_memory_bytes = Some(6 * GIB);
    let models = [
        gpu_model("big", 1, 1, 2),
        gpu_model("new", 1, 1, 5),
        gpu_model("new-old", 1, 1, 1),
    ];
    let p = plan(&nodes, &models, &[existing, other], &Load::default());
    assert!(p.add.is_empty());
    assert!(
        p.unplaced[0]
            .reason
            .to_string()
            .contains("GPU 0 has 4.0 GiB free, needs 5.0 GiB")
    );
}

#[test]
fn a_multi_gpu_model_gets_distinct_gpus_on_one_node() {
    let nodes = [gpu_node("a", &[16]), gpu_node("b", &[16, 4, 16, 16])];
    let p = plan(&nodes, &[gpu_model("llm", 1, 3, 8)], &[], &Load::default());
    assert_eq!(placed(&p), [("llm", "b", vec![0, 2, 3])]);
    assert_eq!(p.add[0].skipped, ["node a: has 1 GPU(s), needs 3"]);

    let p = plan(&nodes, &[gpu_model("llm", 1, 4, 8)], &[], &Load::default());
    let why = p.unplaced[0].reason.to_string();
    assert!(
        why.contains("node b: only 3 GPU(s) fit; GPU 1 has 4.0 GiB free, needs 8.0 GiB"),
        "{why}"
    );
}

#[test]
fn gpu_replicas_spread_across_nodes_and_gpus() {
    let nodes = [gpu_node("a", &[24, 24]), gpu_node("b", &[24, 24])];
    let p = plan(
        &nodes,
        &[gpu_model("m", 2, 1, 8), gpu_model("n", 2, 1, 8)],
        &[],
        &Load::default(),
    );
    // One replica of each model per node, and on each node the two models on different GPUs.
    let got = placed(&p);
    assert_eq!(got.len(), 4, "{got:?}");
    for n in ["a", "b"] {
        let here: Vec<&Vec<u32>> = got.iter().filter(|g| g.1 == n).map(|g| &g.2).collect();
        assert_eq!(here.len(), 2, "{got:?}");
        assert_ne!(here[0], here[1], "{got:?}");
    }
    let p = plan(&nodes, &[gpu_model("m", 3, 1, 8)], &[], &Load::default());
    assert!(matches!(
        p.unplaced[0].reason,
        Reason::NotEnoughNodes { eligible_nodes: 2 }
    ));
}

#[test]
fn a_lost_gpu_node_is_replaced_on_another_nodes_gpu() {
    let mut down = gpu_node("a", &[16]);
    down.up = false;
    let nodes = [down, gpu_node("b", &[16]), gpu_node("c", &[4])];
    let lost = on_gpus(1, "m", "a", &[0]);
    let p = plan(
        &nodes,
        &[gpu_model("m", 1, 1, 8)],
        &[lost],
        &Load::default(),
    );
    assert_eq!(
        p.remove,
        [Removal {
            replica: 1,
            reason: Reason::NodeDown
        }]
    );
    assert_eq!(placed(&p), [("m", "b", vec![0])]);
    assert_eq!(p.add[0].reason, Reason::NodeDown);
}

#[test]
fn cpu_models_ignore_gpus() {
    let nodes = [gpu_node("a", &[1])];
    let p = plan(&nodes, &[model("cpu", 1, 1)], &[], &Load::default());
    assert_eq!(placed(&p), [("cpu", "a", vec![])]);
    assert!(p.add[0].gpu_note().is_empty());
}
