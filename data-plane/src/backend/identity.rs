//! Triton's `identity` test backend (`backend: "identity"`): every output is a copy of its
//! input, renamed. No model file: the version directory may be empty.
//!
//! ```text
//!  load_instance: config ─► pair outputs with inputs (same data_type, same shape)
//!                        ─► parameters (execute_delay_ms, ...) ─► IdentityInstance
//!  execute:       sleep execute_delay_ms ─► for each requested output: its input (the batch's
//!                 parts joined; a lone request's tensor as it is), renamed
//! ```
//!
//! Pairing follows Triton's identity backend where the config uses its naming (`OUTPUT<i>` is
//! the copy of `INPUT<i>`); any other output is paired with the input at the same position in
//! the config. Outputs share the input's bytes (no copy) and keep its shape, batch dimension
//! included. A config `reshape` is not applied: the output has the shape the client sent.
//!
//! | config `parameters` key          | meaning                                              |
//! |----------------------------------|------------------------------------------------------|
//! | `execute_delay_ms`               | sleep this long in every execution (queueing tests)  |
//! | `instance_wise_delay_multiplier` | `> 0`: multiply the delay by the instance's GPU id   |
//! | `creation_delay_sec`             | sleep this long while loading each instance          |

use std::time::Duration;

use nereid_proto::{Tensor, format_shape};

use super::params::non_negative;
use super::{Backend, BackendError, BackendInstance, BatchInputs, DeviceKind, InstanceContext};
use crate::config::ValidModelConfig;

/// The identity backend. Stateless: everything it needs is in the config.
#[derive(Debug, Default)]
pub struct IdentityBackend;

impl Backend for IdentityBackend {
    fn name(&self) -> &'static str {
        "identity"
    }

    /// No file: the model path is the version directory itself.
    fn default_model_filename(&self) -> &'static str {
        ""
    }

    fn load_instance(
        &self,
        ctx: &InstanceContext,
    ) -> Result<Box<dyn BackendInstance>, BackendError> {
        let config = &ctx.config;
        let pairs = pair_outputs(config).map_err(BackendError::Load)?;
        let parameter = |key| {
            non_negative(&config.parameters, key)
                .map(|v| v.map(|n| n as u64))
                .map_err(|e| BackendError::Load(format!("model '{}': {e}", config.name)))
        };
        let mut delay = Duration::from_millis(parameter("execute_delay_ms")?.unwrap_or(0));
        if let (Some(multiplier), DeviceKind::Gpu { device_id }) =
            (parameter("instance_wise_delay_multiplier")?, ctx.device)
            && multiplier > 0
        {
            delay *= u32::try_from(device_id.max(1)).unwrap_or(1);
        }
        if let Some(secs) = parameter("creation_delay_sec")? {
            std::thread::sleep(Duration::from_secs(secs));
        }
        Ok(Box::new(IdentityInstance { pairs, delay }))
    }
}

/// One identity instance: which input each output copies, and the per-execution delay.
struct IdentityInstance {
    /// `(output name, input name)`, in config order.
    pairs: Vec<(String, String)>,
    delay: Duration,
}

impl BackendInstance for IdentityInstance {
    fn execute(
        &mut self,
        inputs: &BatchInputs<'_>,
        outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError> {
        if !self.delay.is_zero() {
            // Instances run on their own OS thread, so blocking here is what a slow model does.
            std::thread::sleep(self.delay);
        }
        outputs
            .iter()
            .map(|output| {
                let Some((_, input)) = self.pairs.iter().find(|(o, _)| o == output) else {
                    return Err(BackendError::InvalidInput(format!(
                        "unexpected inference output '{output}' for the identity model"
                    )));
                };
                let tensor = inputs.get(input).ok_or_else(|| {
                    BackendError::InvalidInput(format!(
                        "failed to get input '{input}' for output '{output}'"
                    ))
                })?;
                Ok(tensor.joined()?.renamed(output.as_str()))
            })
            .collect()
    }
}

/// Pairs every config output with the input it copies and checks that the two agree in
/// data_type and shape (`reshape` if set, else `dims`), as Triton's identity backend does.
fn pair_outputs(config: &ValidModelConfig) -> Result<Vec<(String, String)>, String> {
    let m = &config.name;
    let mut pairs = Vec::with_capacity(config.outputs.len());
    for (position, output) in config.outputs.iter().enumerate() {
        let by_suffix = output.name.strip_prefix("OUTPUT").and_then(|suffix| {
            config
                .inputs
                .iter()
                .find(|i| i.name.strip_prefix("INPUT") == Some(suffix))
        });
        let Some(input) = by_suffix.or_else(|| config.inputs.get(position)) else {
            return Err(format!(
                "model '{m}': identity output '{}' has no input to copy: output {position} copies input {position} (or OUTPUT<i> copies INPUT<i>), but the config has {} input(s)",
                output.name,
                config.inputs.len()
            ));
        };
        if input.datatype != output.datatype {
            return Err(format!(
                "model '{m}': identity output '{}' has data_type {} but its input '{}' has {}; they must match",
                output.name,
                output.datatype.to_config().as_str_name(),
                input.name,
                input.datatype.to_config().as_str_name()
            ));
        }
        let input_shape = input.reshape.as_ref().unwrap_or(&input.dims);
        let output_shape = output.reshape.as_ref().unwrap_or(&output.dims);
        if input_shape != output_shape {
            return Err(format!(
                "model '{m}': identity output '{}' has shape {} but its input '{}' has {}; they must match",
                output.name,
                format_shape(output_shape),
                input.name,
                format_shape(input_shape)
            ));
        }
        pairs.push((output.name.clone(), input.name.clone()));
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;
    use std::time::Instant;

    use bytes::Bytes;
    use nereid_proto::{DataType, push_bytes_element};

    use super::*;
    use crate::backend::Backends;
    use crate::backend::{CompleteOptions, complete};
    use crate::config::text::parse_model_config;

    const CONFIG: &str = r#"
        name: "id" backend: "identity" max_batch_size: 8
        input [
          { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
          { name: "INPUT1" data_type: TYPE_INT64 dims: [ 2 ] },
          { name: "INPUT2" data_type: TYPE_BOOL dims: [ 1 ] },
          { name: "INPUT3" data_type: TYPE_STRING dims: [ -1 ] }
        ]
        output [
          { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
          { name: "OUTPUT1" data_type: TYPE_INT64 dims: [ 2 ] },
          { name: "OUTPUT2" data_type: TYPE_BOOL dims: [ 1 ] },
          { name: "OUTPUT3" data_type: TYPE_STRING dims: [ -1 ] }
        ]"#;

    fn ctx(config: ValidModelConfig) -> InstanceContext {
        InstanceContext {
            model_name: config.name.clone(),
            version: 1,
            model_dir: PathBuf::from("/nonexistent/id"),
            model_path: PathBuf::from("/nonexistent/id/1"),
            config: Arc::new(config),
            instance_name: "id_0".into(),
            device: DeviceKind::Cpu,
            health: Default::default(),
            server: Default::default(),
        }
    }

    fn typed(text: &str) -> ValidModelConfig {
        ValidModelConfig::unchecked(parse_model_config(text).unwrap())
    }

    fn load(text: &str) -> Result<Box<dyn BackendInstance>, BackendError> {
        IdentityBackend.load_instance(&ctx(typed(text)))
    }

    /// The load failure of a model with one FP32 input of dims [2] and `outputs`.
    fn load_error(outputs: &str) -> String {
        let text = format!(
            r#"name: "m" backend: "identity"
            input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }}]
            output [{outputs}]"#
        );
        match load(&text) {
            Err(BackendError::Load(m)) => m,
            Err(e) => panic!("outputs {outputs}: {e:?}"),
            Ok(_) => panic!("outputs {outputs} loaded"),
        }
    }

    fn pairs(text: &str) -> Vec<(String, String)> {
        pair_outputs(&typed(text)).unwrap()
    }

    fn with_param(text: &str, key: &str, value: &str) -> ValidModelConfig {
        let mut c = typed(text);
        c.parameters.insert(key.into(), value.into());
        c
    }

    fn inputs() -> Vec<Tensor> {
        let f32s: Vec<u8> = [1.5f32, -2.0, 3.25]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let i64s: Vec<u8> = [7i64, -9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut strings = Vec::new();
        push_bytes_element(&mut strings, b"hello");
        push_bytes_element(&mut strings, b"");
        let t = |n: &str, d, s: Vec<i64>, b: Vec<u8>| Tensor::new(n, d, s, Bytes::from(b)).unwrap();
        vec![
            t("INPUT0", DataType::Fp32, vec![1, 3], f32s),
            t("INPUT1", DataType::Int64, vec![1, 2], i64s),
            t("INPUT2", DataType::Bool, vec![1, 1], vec![1]),
            t("INPUT3", DataType::Bytes, vec![1, 2], strings),
        ]
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn outputs_are_renamed_zero_copy_inputs() {
        let mut instance = load(CONFIG).unwrap();
        let inputs = inputs();
        let out = instance
            .execute(
                &BatchInputs::single(&inputs),
                &names(&["OUTPUT0", "OUTPUT1", "OUTPUT2", "OUTPUT3"]),
            )
            .unwrap();
        assert_eq!(out.len(), 4);
        for (i, (o, input)) in out.iter().zip(&inputs).enumerate() {
            assert_eq!(o.name(), format!("OUTPUT{i}"));
            assert_eq!(o.datatype(), input.datatype());
            assert_eq!(o.shape(), input.shape());
            assert_eq!(o.data(), input.data());
            assert_eq!(
                o.data().as_ptr(),
                input.data().as_ptr(),
                "output {i} was copied"
            );
        }
    }

    #[test]
    fn only_requested_outputs_in_requested_order() {
        let mut instance = load(CONFIG).unwrap();
        let out = instance
            .execute(
                &BatchInputs::single(&inputs()),
                &names(&["OUTPUT3", "OUTPUT0"]),
            )
            .unwrap();
        let got: Vec<&str> = out.iter().map(Tensor::name).collect();
        assert_eq!(got, ["OUTPUT3", "OUTPUT0"]);
        assert_eq!(out[0].datatype(), DataType::Bytes);
        assert!(
            instance
                .execute(&BatchInputs::single(&inputs()), &[])
                .unwrap()
                .is_empty()
        );
        let e = instance
            .execute(&BatchInputs::single(&inputs()), &names(&["OUTPUT9"]))
            .unwrap_err();
        assert!(matches!(e, BackendError::InvalidInput(m) if m.contains("'OUTPUT9'")));
        let e = instance
            .execute(&BatchInputs::single(&inputs()[1..]), &names(&["OUTPUT0"]))
            .unwrap_err();
        assert!(matches!(e, BackendError::InvalidInput(m) if m.contains("'INPUT0'")));
    }

    #[test]
    fn pairs_by_position_or_by_triton_index() {
        let positional = r#"name: "p" backend: "identity"
            input [{ name: "a" data_type: TYPE_INT32 dims: [1] }, { name: "b" data_type: TYPE_FP32 dims: [1] }]
            output [{ name: "x" data_type: TYPE_INT32 dims: [1] }, { name: "y" data_type: TYPE_FP32 dims: [1] }]"#;
        assert_eq!(
            pairs(positional),
            [("x".into(), "a".into()), ("y".into(), "b".into())]
        );
        let swapped = r#"name: "s" backend: "identity"
            input [{ name: "INPUT1" data_type: TYPE_INT32 dims: [1] }, { name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
            output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [1] }]"#;
        assert_eq!(
            pairs(swapped),
            [
                ("OUTPUT0".into(), "INPUT0".into()),
                ("OUTPUT1".into(), "INPUT1".into())
            ]
        );
    }

    #[test]
    fn load_refuses_outputs_that_do_not_match_an_input() {
        assert_eq!(
            load_error(r#"{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [2] }"#),
            "model 'm': identity output 'OUTPUT0' has data_type TYPE_INT32 but its input 'INPUT0' has TYPE_FP32; they must match"
        );
        let m = load_error(
            r#"{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [2] }, { name: "extra" data_type: TYPE_FP32 dims: [2] }"#,
        );
        assert!(m.contains("'extra' has no input to copy"), "{m}");
        let m = load_error(r#"{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [3] }"#);
        assert!(
            m.contains("shape [3] but its input 'INPUT0' has [2]"),
            "{m}"
        );
    }

    #[test]
    fn delay_parameter_is_parsed_and_applied() {
        let c = with_param(CONFIG, "execute_delay_ms", " 30 ");
        let mut instance = IdentityBackend.load_instance(&ctx(c)).unwrap();
        let start = Instant::now();
        instance
            .execute(&BatchInputs::single(&inputs()), &names(&["OUTPUT0"]))
            .unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(30),
            "{:?}",
            start.elapsed()
        );
        for bad in ["-1", "1.5", "abc", ""] {
            let c = with_param(CONFIG, "execute_delay_ms", bad);
            let Err(BackendError::Load(m)) = IdentityBackend.load_instance(&ctx(c)) else {
                panic!("execute_delay_ms '{bad}' accepted")
            };
            assert!(
                m.contains("parameter 'execute_delay_ms' must be a non-negative integer"),
                "{m}"
            );
        }
        let c = with_param(CONFIG, "creation_delay_sec", "soon");
        assert!(IdentityBackend.load_instance(&ctx(c)).is_err());
    }

    #[test]
    fn loads_from_an_empty_version_directory() {
        let repo = tempfile::tempdir().unwrap();
        let version = repo.path().join("id").join("1");
        std::fs::create_dir_all(&version).unwrap();
        let raw = parse_model_config(CONFIG).unwrap();
        let backends = Backends::new(None);
        let options = CompleteOptions {
            auto_complete: true,
        };
        let complete = complete(
            "id",
            raw,
            std::slice::from_ref(&version),
            &backends,
            options,
        )
        .unwrap();
        assert_eq!(complete.backend, "identity");
        assert_eq!(complete.default_model_filename, "");
        let backend = backends.get(&complete.backend).unwrap();
        let mut c = ctx(complete);
        c.model_path = version.join(&c.config.default_model_filename);
        let mut instance = backend.load_instance(&c).unwrap();
        assert_eq!(
            instance
                .execute(&BatchInputs::single(&inputs()), &names(&["OUTPUT1"]))
                .unwrap()
                .len(),
            1
        );
    }
}
