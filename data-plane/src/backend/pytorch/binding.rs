//! Which config input feeds which `forward()` argument, and which returned value is which
//! config output: Triton's PyTorch naming conventions. Pure.
//!
//! Inputs, first rule that applies:
//! 1. `forward(self, inputs: Dict[str, Tensor])`: every input goes into one dict, keyed by its
//!    config name.
//! 2. Every config input is named like a `forward()` argument: bound by name.
//! 3. Every config input is named `<anything>__<index>` (`INPUT__0`): bound by index.
//! 4. Otherwise: bound in config order.
//!
//! Rules 2–4 need as many config inputs as `forward()` has arguments. Outputs: all named
//! `<anything>__<index>` → that element of the returned tuple/list, else config order.

use super::signature::ForwardSignature;

/// How a request's inputs become `forward()` arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum InputBinding {
    /// Argument `i` is the config input named `names[i]`.
    Positional(Vec<String>),
    /// One `Dict[str, Tensor]` argument holding these inputs under their config names.
    Dict(Vec<String>),
}

/// `<name>__<index>` → `index`.
fn named_index(name: &str) -> Option<usize> {
    let (stem, index) = name.rsplit_once("__")?;
    if stem.is_empty() || index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    index.parse().ok()
}

/// Places `names` by their `__<index>` suffix; `None` when not every name has one. `kind` is
/// "input" or "output", for errors.
fn by_index(names: &[String], kind: &str) -> Option<Result<Vec<usize>, String>> {
    let indices: Vec<usize> = names
        .iter()
        .map(|n| named_index(n))
        .collect::<Option<_>>()?;
    let mut seen = vec![false; names.len()];
    for (name, &index) in names.iter().zip(&indices) {
        if index >= names.len() {
            return Some(Err(format!(
                "{kind} '{name}': index {index} is out of range, the model has {} {kind}s (indices start at 0)",
                names.len()
            )));
        }
        if std::mem::replace(&mut seen[index], true) {
            return Some(Err(format!(
                "{kind} '{name}': another {kind} already has index {index}"
            )));
        }
    }
    Some(Ok(indices))
}

/// Binds the config's `inputs` to `forward()`'s arguments. `signature` is `None` when the
/// file's signature could not be read: then only rules 3 and 4 apply, unchecked.
pub(crate) fn bind_inputs(
    inputs: &[String],
    signature: Option<&ForwardSignature>,
) -> Result<InputBinding, String> {
    if let Some(sig) = signature {
        if let [only] = sig.arguments.as_slice()
            && only.ty.replace(' ', "") == "Dict[str,Tensor]"
        {
            return Ok(InputBinding::Dict(inputs.to_vec()));
        }
        if sig.arguments.len() != inputs.len() {
            return Err(format!(
                "configuration expects {} inputs, model provides {} (forward({}))",
                inputs.len(),
                sig.arguments.len(),
                sig.arguments
                    .iter()
                    .map(|a| format!("{}: {}", a.name, a.ty))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        if inputs
            .iter()
            .all(|i| sig.arguments.iter().any(|a| &a.name == i))
        {
            return Ok(InputBinding::Positional(
                sig.arguments.iter().map(|a| a.name.clone()).collect(),
            ));
        }
    }
    match by_index(inputs, "input") {
        Some(indices) => {
            let mut order = vec![String::new(); inputs.len()];
            for (name, index) in inputs.iter().zip(indices?) {
                order[index] = name.clone();
            }
            Ok(InputBinding::Positional(order))
        }
        None => Ok(InputBinding::Positional(inputs.to_vec())),
    }
}

/// For each config output, the index of its value in what `forward()` returns.
pub(crate) fn bind_outputs(outputs: &[String]) -> Result<Vec<usize>, String> {
    match by_index(outputs, "output") {
        Some(indices) => indices,
        None => Ok((0..outputs.len()).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::signature::Argument;
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn sig(args: &[(&str, &str)]) -> ForwardSignature {
        ForwardSignature {
            arguments: args
                .iter()
                .map(|(n, t)| Argument {
                    name: n.to_string(),
                    ty: t.to_string(),
                })
                .collect(),
            returns: "Tensor".into(),
        }
    }

    #[test]
    fn forward_argument_names_win() {
        let s = sig(&[("a", "Tensor"), ("b", "Tensor")]);
        assert_eq!(
            bind_inputs(&names(&["b", "a"]), Some(&s)).unwrap(),
            InputBinding::Positional(names(&["a", "b"]))
        );
    }

    #[test]
    fn named_indices_order_inputs() {
        let s = sig(&[("x", "Tensor"), ("y", "Tensor")]);
        assert_eq!(
            bind_inputs(&names(&["INPUT__1", "INPUT__0"]), Some(&s)).unwrap(),
            InputBinding::Positional(names(&["INPUT__0", "INPUT__1"]))
        );
        // Without a readable signature the convention still applies.
        assert_eq!(
            bind_inputs(&names(&["B__1", "A__0"]), None).unwrap(),
            InputBinding::Positional(names(&["A__0", "B__1"]))
        );
    }

    #[test]
    fn other_names_follow_config_order() {
        let s = sig(&[("x", "Tensor"), ("y", "Tensor")]);
        assert_eq!(
            bind_inputs(&names(&["first", "second"]), Some(&s)).unwrap(),
            InputBinding::Positional(names(&["first", "second"]))
        );
        // A mix of conventions is config order too.
        assert_eq!(
            bind_inputs(&names(&["INPUT__1", "x"]), Some(&s)).unwrap(),
            InputBinding::Positional(names(&["INPUT__1", "x"]))
        );
    }

    #[test]
    fn a_dict_argument_takes_every_input() {
        let s = sig(&[("inputs", "Dict[str, Tensor]")]);
        assert_eq!(
            bind_inputs(&names(&["x", "scale"]), Some(&s)).unwrap(),
            InputBinding::Dict(names(&["x", "scale"]))
        );
    }

    #[test]
    fn input_count_and_indices_are_checked() {
        let s = sig(&[("x", "Tensor")]);
        assert_eq!(
            bind_inputs(&names(&["x", "y"]), Some(&s)).unwrap_err(),
            "configuration expects 2 inputs, model provides 1 (forward(x: Tensor))"
        );
        let s2 = sig(&[("x", "Tensor"), ("y", "Tensor")]);
        assert_eq!(
            bind_inputs(&names(&["INPUT__0", "INPUT__2"]), Some(&s2)).unwrap_err(),
            "input 'INPUT__2': index 2 is out of range, the model has 2 inputs (indices start at 0)"
        );
        assert_eq!(
            bind_inputs(&names(&["INPUT__0", "X__0"]), Some(&s2)).unwrap_err(),
            "input 'X__0': another input already has index 0"
        );
    }

    #[test]
    fn outputs_bind_by_index_or_order() {
        assert_eq!(
            bind_outputs(&names(&["SUM__1", "DIFF__0"])).unwrap(),
            [1, 0]
        );
        assert_eq!(bind_outputs(&names(&["sum", "diff"])).unwrap(), [0, 1]);
        assert_eq!(bind_outputs(&names(&["OUTPUT__0__x"])).unwrap(), [0]);
        assert!(bind_outputs(&names(&["OUTPUT__3"])).is_err());
    }
}
