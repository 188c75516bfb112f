//! The `forward()` signature of a TorchScript file: argument names and types, as Triton's PyTorch
//! backend reads them from the module's schema to bind inputs by name.
//!
//! ```text
//!  model.pt (zip) ─► <root>/data.pkl: first pickle GLOBAL = root class (`__torch__.Mlp`)
//!                 ─► <root>/code/__torch__.py: `class Mlp(Module): ... def forward(self: ...,
//!                                                    x: Tensor) -> Tensor:`
//! ```
//! tch does not expose method schemas, so the signature is read from the serialized code that
//! `torch.jit.save` writes (the same text `module.code` shows in Python). Parsing is pure and
//! tested on that text; [`read`] only opens the archive.

/// One `forward()` argument (without `self`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Argument {
    pub name: String,
    /// TorchScript type, as written: `Tensor`, `Dict[str, Tensor]`, `Optional[Tensor]`...
    pub ty: String,
}

/// The root module's `forward()`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ForwardSignature {
    pub arguments: Vec<Argument>,
    /// The return type, as written (`Tensor`, `Tuple[Tensor, Tensor]`, `List[Tensor]`).
    pub returns: String,
}

/// The root class named by a `data.pkl`: its first pickle `GLOBAL` (`c<module>\n<class>\n`),
/// as `(module, class)`.
pub(crate) fn root_class(data_pkl: &[u8]) -> Option<(String, String)> {
    // Protocol 2 header (0x80 0x02), then GLOBAL ('c').
    let rest = data_pkl.strip_prefix(&[0x80, 0x02, b'c'])?;
    let mut lines = rest.splitn(3, |&b| b == b'\n');
    let module = std::str::from_utf8(lines.next()?).ok()?;
    let class = std::str::from_utf8(lines.next()?).ok()?;
    lines.next()?;
    if module.is_empty() || class.is_empty() {
        return None;
    }
    Some((module.to_string(), class.to_string()))
}

/// The archive path of the code file holding `module`'s classes, under the archive's root
/// directory: `__torch__.a.b` → `code/__torch__/a/b.py`.
pub(crate) fn code_path(module: &str) -> String {
    format!("code/{}.py", module.replace('.', "/"))
}

/// Finds `class <class>(...)` in `code` and parses its `def forward(self...)`.
pub(crate) fn parse_forward(code: &str, class: &str) -> Result<ForwardSignature, String> {
    let class_start = code
        .find(&format!("class {class}("))
        .ok_or_else(|| format!("class '{class}' not found in the module code"))?;
    let body = &code[class_start..];
    // The class ends where the next top-level `class` starts.
    let body = match body[1..].find("\nclass ") {
        Some(end) => &body[..end + 1],
        None => body,
    };
    let def = body
        .find("def forward(")
        .ok_or_else(|| format!("class '{class}' has no forward() method"))?;
    let after = &body[def + "def forward(".len()..];
    let close = matching_paren(after)
        .ok_or_else(|| "forward(): unbalanced parentheses in its signature".to_string())?;
    let params = &after[..close];
    let returns = after[close + 1..]
        .trim_start()
        .strip_prefix("->")
        .and_then(|r| r.split_once(':').map(|(ty, _)| ty.trim().to_string()))
        .unwrap_or_default();
    let mut arguments = Vec::new();
    for (index, param) in split_top_level(params).into_iter().enumerate() {
        let param = param.trim();
        if param.is_empty() {
            continue;
        }
        // `name: Type = default`.
        let declaration = param.split_once('=').map_or(param, |(d, _)| d).trim();
        let (name, ty) = match declaration.split_once(':') {
            Some((name, ty)) => (name.trim(), ty.trim()),
            None => (declaration, "Tensor"),
        };
        if index == 0 && name == "self" {
            continue;
        }
        arguments.push(Argument {
            name: name.to_string(),
            ty: ty.to_string(),
        });
    }
    Ok(ForwardSignature { arguments, returns })
}

/// Index of the `)` closing the parenthesis opened just before `text`.
fn matching_paren(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ')' if depth == 0 => return Some(i),
            ')' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// Splits on commas outside brackets (`Dict[str, Tensor]` stays whole).
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in text.char_indices() {
        match c {
            '[' | '(' => depth += 1,
            ']' | ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Reads the root module's `forward()` signature from a TorchScript file.
pub(crate) fn read(model_file: &std::path::Path) -> Result<ForwardSignature, String> {
    use std::io::Read;

    let file = std::fs::File::open(model_file).map_err(|e| e.to_string())?;
    let mut archive =
        zip::ZipArchive::new(file).map_err(|e| format!("not a TorchScript archive: {e}"))?;
    let pkl_name = archive
        .file_names()
        .filter(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
        .map(str::to_string)
        .next()
        .ok_or("not a TorchScript archive: no data.pkl")?;
    let root = pkl_name.trim_end_matches("data.pkl").to_string();
    let mut read_entry = |name: &str| -> Result<Vec<u8>, String> {
        let mut entry = archive
            .by_name(name)
            .map_err(|e| format!("archive entry '{name}': {e}"))?;
        let mut bytes = Vec::new();
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| format!("archive entry '{name}': {e}"))?;
        Ok(bytes)
    };
    let pkl = read_entry(&pkl_name)?;
    let (module, class) =
        root_class(&pkl).ok_or("data.pkl does not name the root module's class")?;
    let code = read_entry(&format!("{root}{}", code_path(&module)))?;
    let code = String::from_utf8(code).map_err(|_| "module code is not UTF-8".to_string())?;
    parse_forward(&code, &class)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CODE: &str = "class Types(Module):
  __parameters__ = []
  training : bool
  def helper(self: __torch__.Types, z: Tensor) -> Tensor:
    return z
  def forward(self: __torch__.Types,
    inputs: Dict[str, Tensor],
    scale: Optional[Tensor]=None,
    n: Tuple[int, int]) -> Tuple[Tensor, List[Tensor]]:
    return (inputs[\"x\"], [inputs[\"y\"]])
class Other(Module):
  def forward(self: __torch__.Other,
    q: Tensor) -> Tensor:
    return q
";

    #[test]
    fn forward_arguments_and_return_type_are_parsed() {
        let sig = parse_forward(CODE, "Types").unwrap();
        let args: Vec<(&str, &str)> = sig
            .arguments
            .iter()
            .map(|a| (a.name.as_str(), a.ty.as_str()))
            .collect();
        assert_eq!(
            args,
            [
                ("inputs", "Dict[str, Tensor]"),
                ("scale", "Optional[Tensor]"),
                ("n", "Tuple[int, int]")
            ]
        );
        assert_eq!(sig.returns, "Tuple[Tensor, List[Tensor]]");
        let other = parse_forward(CODE, "Other").unwrap();
        assert_eq!(other.arguments[0].name, "q");
    }

    #[test]
    fn missing_class_or_forward_is_an_error() {
        assert_eq!(
            parse_forward(CODE, "Absent").unwrap_err(),
            "class 'Absent' not found in the module code"
        );
        let no_forward = "class A(Module):\n  def f(self: A) -> int:\n    return 1\n";
        assert_eq!(
            parse_forward(no_forward, "A").unwrap_err(),
            "class 'A' has no forward() method"
        );
    }

    #[test]
    fn root_class_comes_from_the_first_global() {
        let pkl = b"\x80\x02c__torch__.a.b\nNet\nq\x00)\x81}";
        assert_eq!(
            root_class(pkl),
            Some(("__torch__.a.b".to_string(), "Net".to_string()))
        );
        assert_eq!(code_path("__torch__.a.b"), "code/__torch__/a/b.py");
        assert_eq!(code_path("__torch__"), "code/__torch__.py");
        assert_eq!(root_class(b"\x80\x03}q\x00"), None);
    }
}
