//! `model_metrics` (newer Triton's config field; Triton 2.51 refuses it): per-model overrides
//! of a metric family's options. Today, as in Triton, the one customizable family is
//! `nv_inference_first_response_histogram_ms`, whose bucket bounds a model may set.
//!
//! ```text
//! model_metrics { metric_control: [ { metric_identifier: { family: F }
//!                                     histogram_options: { buckets: [ ... ] } } ] }
//!   ─► ModelMetrics::from_wire (Triton's checks, plus increasing finite bounds)
//!   ─► ModelMetrics { first_response_buckets, ignored_families }
//!   ─► the version's statistics count into those buckets (`stats::VersionStats`)
//! ```
//!
//! A family that is not customizable is ignored with a warning (Triton's behaviour: the
//! field may grow to cover backend metrics); a later entry for the same family wins.

use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_metrics::metric_control::MetricOptions;

/// The histogram family whose buckets a model may override.
pub const FIRST_RESPONSE_HISTOGRAM: &str = "nv_inference_first_response_histogram_ms";

/// A model's `model_metrics`, checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModelMetrics {
    /// Bucket upper bounds (milliseconds, strictly increasing, finite) of
    /// `nv_inference_first_response_histogram_ms`; `None`: the server's defaults.
    pub first_response_buckets: Option<Vec<f64>>,
    /// Families named in `metric_identifier` that are not customizable (ignored).
    pub ignored_families: Vec<String>,
}

impl ModelMetrics {
    /// Checks `wire.model_metrics` with Triton's messages (each naming the entry and the
    /// model); logs a warning for each family that is not customizable.
    pub fn from_wire(wire: &ModelConfig) -> Result<ModelMetrics, Vec<String>> {
        let mut out = ModelMetrics::default();
        let mut errors = Vec::new();
        let controls = wire.model_metrics.iter().flat_map(|m| &m.metric_control);
        for (index, control) in controls.enumerate() {
            let at = format!(
                "model_metrics.metric_control[{index}] of model '{}'",
                wire.name
            );
            let Some(identifier) = &control.metric_identifier else {
                errors.push(format!(
                    "metric control must specify 'metric_identifier' ({at})"
                ));
                continue;
            };
            if identifier.family.is_empty() {
                errors.push(format!(
                    "metric identifier must specify non-empty 'family' ({at})"
                ));
                continue;
            }
            let Some(MetricOptions::HistogramOptions(options)) = &control.metric_options else {
                errors.push(format!(
                    "metric control must specify 'histogram_options' ({at})"
                ));
                continue;
            };
            let buckets = &options.buckets;
            if buckets.is_empty() {
                errors.push(format!(
                    "histogram options must specify non-empty 'buckets' ({at})"
                ));
                continue;
            }
            let increasing = buckets.windows(2).all(|w| w[0] < w[1]);
            if !increasing || buckets.iter().any(|b| !b.is_finite()) {
                errors.push(format!(
                    "histogram options 'buckets' must be finite and strictly increasing, got {buckets:?} ({at})"
                ));
                continue;
            }
            if identifier.family == FIRST_RESPONSE_HISTOGRAM {
                out.first_response_buckets = Some(buckets.clone());
            } else {
                tracing::warn!(
                    model = %wire.name,
                    "Metric family '{}' in 'metric_identifier' is not a customizable metric (customizable: {FIRST_RESPONSE_HISTOGRAM}); ignored",
                    identifier.family
                );
                out.ignored_families.push(identifier.family.clone());
            }
        }
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::text::parse_model_config;

    fn of(text: &str) -> Result<ModelMetrics, Vec<String>> {
        let mut wire = parse_model_config(text).unwrap();
        wire.name = "m".into();
        ModelMetrics::from_wire(&wire)
    }

    fn control(body: &str) -> String {
        format!("model_metrics {{ metric_control: [ {{ {body} }} ] }}")
    }

    #[test]
    fn first_response_buckets_are_overridden_and_the_last_entry_wins() {
        assert_eq!(of("").unwrap(), ModelMetrics::default());
        let m = of(r#"model_metrics { metric_control: [
              { metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
                histogram_options: { buckets: [ 1, 2, 4 ] } },
              { metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
                histogram_options: { buckets: [ -1, 0.0, 1, 2.5 ] } } ] }"#)
        .unwrap();
        assert_eq!(m.first_response_buckets, Some(vec![-1.0, 0.0, 1.0, 2.5]));
        assert!(m.ignored_families.is_empty());
    }

    #[test]
    fn a_family_that_is_not_customizable_is_ignored() {
        let m = of(&control(
            r#"metric_identifier: { family: "nv_inference_request_success" }
               histogram_options: { buckets: [ 1, 2, 4, 8 ] }"#,
        ))
        .unwrap();
        assert_eq!(m.first_response_buckets, None);
        assert_eq!(m.ignored_families, ["nv_inference_request_success"]);
    }

    #[test]
    fn incomplete_entries_are_refused_with_triton_messages() {
        let cases = [
            (
                r#"histogram_options: { buckets: [ 1 ] }"#,
                "metric control must specify 'metric_identifier'",
            ),
            (
                r#"metric_identifier: {} histogram_options: { buckets: [ 1 ] }"#,
                "metric identifier must specify non-empty 'family'",
            ),
            (
                r#"metric_identifier: { family: "nv_inference_first_response_histogram_ms" }"#,
                "metric control must specify 'histogram_options'",
            ),
            (
                r#"metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
                   histogram_options: {}"#,
                "histogram options must specify non-empty 'buckets'",
            ),
            (
                r#"metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
                   histogram_options: { buckets: [] }"#,
                "histogram options must specify non-empty 'buckets'",
            ),
        ];
        for (body, expected) in cases {
            let errors = of(&control(body)).unwrap_err();
            assert_eq!(
                errors,
                [format!(
                    "{expected} (model_metrics.metric_control[0] of model 'm')"
                )],
                "{body}"
            );
        }
    }

    #[test]
    fn buckets_must_increase() {
        for buckets in ["[ 1, 10, 5 ]", "[ 1, 1 ]", "[ 1, inf ]", "[ nan ]"] {
            let errors = of(&control(&format!(
                r#"metric_identifier: {{ family: "nv_inference_first_response_histogram_ms" }}
                   histogram_options: {{ buckets: {buckets} }}"#
            )))
            .unwrap_err();
            assert_eq!(errors.len(), 1, "{buckets}");
            assert!(
                errors[0].starts_with(
                    "histogram options 'buckets' must be finite and strictly increasing, got ["
                ),
                "{buckets}: {errors:?}"
            );
            assert!(errors[0].ends_with("(model_metrics.metric_control[0] of model 'm')"));
        }
    }
}
