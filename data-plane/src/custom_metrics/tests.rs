//! The registry's behaviour: what a model sees and what /metrics shows.

use nereid_telemetry::{Labels, render_prometheus};

use super::*;

fn labels(pairs: &[(&str, &str)]) -> LabelSet {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn text(registry: &CustomMetrics) -> String {
    render_prometheus(&registry.families())
}

fn registry() -> Arc<CustomMetrics> {
    Arc::new(CustomMetrics::default())
}

#[test]
fn counter_gauge_and_histogram_render_with_help_type_and_sorted_labels() {
    let registry = registry();
    let owner = Owner::new(registry.clone());
    owner
        .family_new(
            1,
            "requests_custom",
            "Cumulative requests",
            MetricKind::Counter,
        )
        .unwrap();
    owner
        .metric_new(2, 1, labels(&[("version", "1"), ("model", "m")]), None)
        .unwrap();
    owner.update(2, Update::Increment(2.0)).unwrap();
    owner.update(2, Update::Increment(1.5)).unwrap();
    assert_eq!(owner.value(2), Ok(3.5));

    owner
        .family_new(3, "temperature", "A gauge", MetricKind::Gauge)
        .unwrap();
    owner.metric_new(4, 3, LabelSet::new(), None).unwrap();
    owner.update(4, Update::Set(5.0)).unwrap();
    owner.update(4, Update::Increment(-7.5)).unwrap();
    assert_eq!(owner.value(4), Ok(-2.5));

    owner
        .family_new(5, "latency_custom", "A histogram", MetricKind::Histogram)
        .unwrap();
    owner
        .metric_new(6, 5, labels(&[("x", "y")]), Some(vec![0.1, 1.0, 10.0]))
        .unwrap();
    for v in [0.05, 0.5, 1.0, 20.0] {
        owner.update(6, Update::Observe(v)).unwrap();
    }

    let text = text(&registry);
    for line in [
        "# HELP requests_custom Cumulative requests\n",
        "# TYPE requests_custom counter\n",
        "requests_custom{model=\"m\",version=\"1\"} 3.5\n",
        "# TYPE temperature gauge\n",
        "temperature -2.5\n",
        "# TYPE latency_custom histogram\n",
        "latency_custom_bucket{x=\"y\",le=\"0.1\"} 1\n",
        "latency_custom_bucket{x=\"y\",le=\"1\"} 3\n",
        "latency_custom_bucket{x=\"y\",le=\"10\"} 3\n",
        "latency_custom_bucket{x=\"y\",le=\"+Inf\"} 4\n",
        "latency_custom_sum{x=\"y\"} 21.55\n",
        "latency_custom_count{x=\"y\"} 4\n",
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
}

#[test]
fn operations_the_kind_does_not_support_are_refused_with_tritons_words() {
    let owner = Owner::new(registry());
    owner.family_new(1, "c", "", MetricKind::Counter).unwrap();
    owner.metric_new(2, 1, LabelSet::new(), None).unwrap();
    owner.family_new(3, "h", "", MetricKind::Histogram).unwrap();
    owner
        .metric_new(4, 3, LabelSet::new(), Some(vec![]))
        .unwrap();
    owner.family_new(5, "g", "", MetricKind::Gauge).unwrap();
    owner.metric_new(6, 5, LabelSet::new(), None).unwrap();

    let refused = |handle, update| owner.update(handle, update).unwrap_err().to_string();
    assert_eq!(
        refused(2, Update::Increment(-1.0)),
        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
    );
    assert_eq!(
        refused(2, Update::Set(1.0)),
        "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"
    );
    assert_eq!(
        refused(2, Update::Observe(1.0)),
        "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"
    );
    assert_eq!(
        refused(6, Update::Observe(1.0)),
        "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"
    );
    assert_eq!(
        refused(4, Update::Increment(1.0)),
        "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"
    );
    assert_eq!(
        refused(4, Update::Set(1.0)),
        "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Set"
    );
    assert_eq!(
        owner.value(4).unwrap_err().to_string(),
        "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"
    );
    assert_eq!(owner.value(2), Ok(0.0), "refused updates change nothing");
    // Triton accepts NaN and infinities; so does Nereid.
    owner.update(2, Update::Increment(f64::INFINITY)).unwrap();
    assert_eq!(owner.value(2), Ok(f64::INFINITY));
}

#[test]
fn names_labels_and_buckets_are_checked() {
    let owner = Owner::new(registry());
    for bad in ["", "1abc", "a-b", "__reserved", "é"] {
        assert_eq!(
            owner.family_new(1, bad, "", MetricKind::Counter),
            Err(MetricError::InvalidName(bad.into()))
        );
    }
    owner
        .family_new(1, "ns:ok_name", "", MetricKind::Counter)
        .unwrap();
    owner
        .family_new(2, "hist", "", MetricKind::Histogram)
        .unwrap();
    for bad in ["1k", "__k", "a:b", ""] {
        assert_eq!(
            owner.metric_new(10, 1, labels(&[(bad, "v")]), None),
            Err(MetricError::InvalidLabelName(bad.into()))
        );
    }
    owner
        .metric_new(10, 1, labels(&[("le", "fine on a counter")]), None)
        .unwrap();
    assert_eq!(
        owner.metric_new(11, 2, labels(&[("le", "1")]), Some(vec![1.0])),
        Err(MetricError::InvalidLabelName("le".into()))
    );
    assert_eq!(
        owner.metric_new(11, 2, LabelSet::new(), None),
        Err(MetricError::MissingBuckets)
    );
    assert_eq!(
        owner.metric_new(11, 1, labels(&[("a", "b")]), Some(vec![1.0])),
        Err(MetricError::UnexpectedBuckets)
    );
    for bad in [
        vec![2.0, 1.0],
        vec![1.0, 1.0],
        vec![f64::NAN],
        vec![f64::INFINITY],
    ] {
        assert!(matches!(
            owner.metric_new(11, 2, LabelSet::new(), Some(bad)),
            Err(MetricError::UnsortedBuckets(_))
        ));
    }
    assert_eq!(
        owner.metric_new(11, 99, LabelSet::new(), None),
        Err(MetricError::UnknownFamily(99))
    );
    assert_eq!(
        owner.metric_new(10, 1, LabelSet::new(), None),
        Err(MetricError::HandleInUse(10))
    );
    assert_eq!(
        owner.update(12, Update::Increment(1.0)),
        Err(MetricError::UnknownMetric(12))
    );
}

#[test]
fn families_are_shared_by_name_and_series_by_labels() {
    let registry = registry();
    let (a, b) = (Owner::new(registry.clone()), Owner::new(registry.clone()));
    a.family_new(1, "shared", "first words", MetricKind::Counter)
        .unwrap();
    b.family_new(1, "shared", "other words", MetricKind::Counter)
        .unwrap();
    assert_eq!(
        b.family_new(2, "shared", "first words", MetricKind::Gauge),
        Err(MetricError::KindConflict {
            name: "shared".into(),
            existing: MetricKind::Counter,
            requested: MetricKind::Gauge
        })
    );
    a.metric_new(2, 1, labels(&[("model", "x")]), None).unwrap();
    b.metric_new(7, 1, labels(&[("model", "x")]), None).unwrap();
    b.metric_new(8, 1, labels(&[("model", "y")]), None).unwrap();
    a.update(2, Update::Increment(1.0)).unwrap();
    b.update(7, Update::Increment(2.0)).unwrap();
    assert_eq!(a.value(2), Ok(3.0), "same labels, same series");

    let families = registry.families();
    assert_eq!(families.len(), 1);
    assert_eq!(
        families[0].help, "first words",
        "the first description is kept"
    );
    assert_eq!(families[0].samples.len(), 2);

    // One handle going leaves the shared series to the other.
    a.metric_delete(2).unwrap();
    assert_eq!(b.value(7), Ok(3.0));
    assert_eq!(a.value(2), Err(MetricError::UnknownMetric(2)));
    drop(b);
    assert!(
        registry.families().is_empty(),
        "a family without series is not rendered"
    );
    // The family lives on through a's handle: its kind still binds.
    let c = Owner::new(registry.clone());
    assert!(matches!(
        c.family_new(1, "shared", "", MetricKind::Gauge),
        Err(MetricError::KindConflict { .. })
    ));
    a.family_delete(1).unwrap();
    c.family_new(1, "shared", "", MetricKind::Gauge).unwrap();
}

#[test]
fn a_family_lives_while_its_metrics_do_and_an_owner_takes_everything_along() {
    let registry = registry();
    let owner = Owner::new(registry.clone());
    owner.family_new(1, "f", "d", MetricKind::Gauge).unwrap();
    owner.metric_new(2, 1, labels(&[("k", "v")]), None).unwrap();
    owner.update(2, Update::Set(4.0)).unwrap();
    owner.family_delete(1).unwrap();
    assert_eq!(owner.value(2), Ok(4.0), "the metric keeps its family");
    assert!(text(&registry).contains("f{k=\"v\"} 4\n"));
    assert_eq!(owner.family_delete(1), Err(MetricError::UnknownFamily(1)));
    owner.metric_delete(2).unwrap();
    assert!(registry.state.lock().families.is_empty());

    owner.family_new(3, "g", "d", MetricKind::Gauge).unwrap();
    owner.metric_new(4, 3, LabelSet::new(), None).unwrap();
    let other = Owner::new(registry.clone());
    other.family_new(1, "g", "d", MetricKind::Gauge).unwrap();
    drop(owner);
    assert!(
        registry.families().is_empty(),
        "the owner's series went with it"
    );
    assert!(
        registry.state.lock().families.contains_key("g"),
        "other still names g"
    );
    other.clear();
    let state = registry.state.lock();
    assert!(state.families.is_empty() && state.owners.is_empty());
}

#[test]
fn an_owner_is_bounded() {
    let owner = Owner::new(registry());
    owner.family_new(0, "f", "", MetricKind::Gauge).unwrap();
    for handle in 1..MAX_HANDLES_PER_OWNER as u64 {
        owner
            .metric_new(handle, 0, labels(&[("i", &handle.to_string())]), None)
            .unwrap();
    }
    assert_eq!(
        owner.metric_new(u64::MAX, 0, LabelSet::new(), None),
        Err(MetricError::TooMany)
    );
    owner.metric_delete(1).unwrap();
    owner
        .metric_new(u64::MAX, 0, LabelSet::new(), None)
        .unwrap();
}

#[test]
fn custom_families_join_server_families_of_the_same_kind_only() {
    let registry = registry();
    let owner = Owner::new(registry.clone());
    owner
        .family_new(1, "nv_inference_count", "ignored", MetricKind::Counter)
        .unwrap();
    owner
        .metric_new(2, 1, labels(&[("custom", "1")]), None)
        .unwrap();
    owner
        .family_new(3, "nv_gpu_utilization", "", MetricKind::Counter)
        .unwrap();
    owner.metric_new(4, 3, LabelSet::new(), None).unwrap();
    owner.family_new(5, "mine", "", MetricKind::Gauge).unwrap();
    owner.metric_new(6, 5, LabelSet::new(), None).unwrap();
    let mut out = vec![
        Family::counter("nv_inference_count", "Number of inferences")
            .with(Labels::of([("model", "m")]), 1.0),
        Family::gauge("nv_gpu_utilization", "GPU utilization").with(Labels::none(), 0.5),
    ];
    registry.merge_into(&mut out);
    let text = render_prometheus(&out);
    assert_eq!(text.matches("# TYPE nv_inference_count").count(), 1);
    assert!(
        text.contains("nv_inference_count{custom=\"1\"} 0\n"),
        "{text}"
    );
    assert!(text.contains("# HELP nv_inference_count Number of inferences\n"));
    assert!(
        !text.contains("nv_gpu_utilization 0\n"),
        "kinds differ: left out\n{text}"
    );
    assert!(text.contains("# TYPE mine gauge\nmine 0\n"), "{text}");
}
