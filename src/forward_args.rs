//! Flags of the infer frontends that only the data plane's own frontends honour (`serve` and
//! `worker`, not the router's pass-through): Triton's header forwarding.

use clap::Args;
use nereid_frontend::{FrontendOptions, HeaderForward};

#[derive(Args, Debug, Clone, Default)]
pub struct ForwardArgs {
    /// Regular expression of the HTTP headers copied into each infer request's parameters, as
    /// string parameters the model reads (Python: `request.parameters()`). Matched
    /// case-insensitively anywhere in the (lower-case) header name; start it with `(?-i)` for
    /// case-sensitive matching. A matching header named like a reserved parameter (sequence_id,
    /// priority, ...) or starting with `triton_` fails the request with 400.
    #[arg(long, env = "NEREID_HTTP_HEADER_FORWARD_PATTERN")]
    pub http_header_forward_pattern: Option<String>,
    /// The same for gRPC metadata of ModelInfer and ModelStreamInfer (INVALID_ARGUMENT for a
    /// reserved name).
    #[arg(long, env = "NEREID_GRPC_HEADER_FORWARD_PATTERN")]
    pub grpc_header_forward_pattern: Option<String>,
}

impl ForwardArgs {
    /// Sets the forwarding patterns in `options`, or says which is not a regular expression.
    pub fn apply(&self, options: &mut FrontendOptions) -> Result<(), String> {
        let compile = |flag: &str, pattern: &Option<String>| {
            HeaderForward::new(pattern.as_deref().unwrap_or(""))
                .map_err(|e| format!("{flag} is not a valid regular expression: {e}"))
        };
        options.http_header_forward = compile(
            "--http-header-forward-pattern",
            &self.http_header_forward_pattern,
        )?;
        options.grpc_header_forward = compile(
            "--grpc-header-forward-pattern",
            &self.grpc_header_forward_pattern,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use nereid_frontend::HeaderForward;

    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<nereid_data_plane::ServeConfig, String> {
        let mut argv = vec!["nereid", "serve", "--model-repository", "."];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Serve(a) => a.into_config(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn forwarding_flags_reach_the_frontend_options() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.frontend.http_header_forward, HeaderForward::default());
        let c = parse(&[
            "--http-header-forward-pattern",
            "my_.*",
            "--grpc-header-forward-pattern",
            "(?-i)x-.*",
        ])
        .unwrap();
        assert_eq!(
            c.frontend.http_header_forward,
            HeaderForward::new("my_.*").unwrap()
        );
        assert_eq!(
            c.frontend.grpc_header_forward,
            HeaderForward::new("(?-i)x-.*").unwrap()
        );
        let grpc = c.frontend.grpc_config(Default::default());
        assert!(grpc.header_forward.is_enabled());
        assert!(
            c.frontend
                .http_config(1, Default::default())
                .header_forward
                .is_enabled()
        );
    }

    #[test]
    fn a_bad_pattern_is_refused_naming_the_flag() {
        let e = parse(&["--http-header-forward-pattern", "(open"]).unwrap_err();
        assert!(
            e.contains("--http-header-forward-pattern is not a valid regular expression"),
            "{e}"
        );
    }
}
