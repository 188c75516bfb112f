//! `nereid check-config PATH...`: lint `config.pbtxt` files, model directories or whole model
//! repositories as strictly as loading them would (see `nereid_data_plane::check_paths`): the
//! same parser, completion and validation, ensembles against the models they name, and the
//! model files' signatures against their configs. Prints each complete config as JSON, or the errors
//! (`file:line:col: message` / `path: message`). Exit status 1 if any model has an error.

use std::process::ExitCode;

use nereid_data_plane::{Backends, CheckOptions, check_paths};
use nereid_proto::message_to_json;

use crate::cli::CheckConfigArgs;

pub fn run(args: CheckConfigArgs) -> ExitCode {
    let backends = Backends::new(crate::ort_library::resolve(
        args.onnxruntime_library.clone(),
    ))
    .with_python(args.python.clone().interpreter());
    let options = CheckOptions {
        auto_complete: args.auto_complete,
        load_models: !args.no_load,
    };
    let mut failed = false;
    for checked in check_paths(&args.paths, &backends, options) {
        match checked.result {
            Ok(config) => {
                let json = message_to_json(&config);
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json).unwrap_or_default()
                );
            }
            Err(errors) => {
                failed = true;
                for error in errors {
                    eprintln!("{error}");
                }
            }
        }
    }
    backends.cleanup();
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
