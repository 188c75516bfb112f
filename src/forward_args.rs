//! Flags of the infer frontends that only the data plane's own frontends honour (`serve` and
//! `worker`, not the router's pass-through): Triton's header forwarding and gRPC infer response
//! compression.

use clap::Args;
use nereid_frontend::{FrontendOptions, HeaderForward, InferCompression};

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
    /// none|low|medium|high: compress ModelInfer and ModelStreamInfer responses with gzip for
    /// clients that accept it (any level but none; tonic has one gzip level). Costs CPU, saves
    /// bandwidth on large outputs over slow links.
    #[arg(
        long,
        env = "NEREID_GRPC_INFER_RESPONSE_COMPRESSION_LEVEL",
        default_value = "none",
        value_parser = parse_compression
    )]
    pub grpc_infer_response_compression_level: InferCompression,
}

fn parse_compression(s: &str) -> Result<InferCompression, String> {
    InferCompression::from_name(s)
        .ok_or_else(|| format!("expected none, low, medium or high, got '{s}'"))
}

impl ForwardArgs {
    /// Sets the forwarding patterns and the compression in `options`, or says which pattern is
    /// not a regular expression.
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
        options.grpc_infer_compression = self.grpc_infer_response_compression_level;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use nereid_frontend::{HeaderForward, InferCompression};

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
    fn forwarding_and_compression_flags_reach_the_frontend_options() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.frontend.http_header_forward, HeaderForward::default());
        assert_eq!(c.frontend.grpc_infer_compression, InferCompression::None);
        let c = parse(&[
            "--http-header-forward-pattern",
            "my_.*",
            "--grpc-header-forward-pattern",
            "(?-i)x-.*",
            "--grpc-infer-response-compression-level",
            "HIGH",
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
        assert_eq!(c.frontend.grpc_infer_compression, InferCompression::High);
        let grpc = c.frontend.grpc_config(Default::default());
        assert_eq!(grpc.infer_compression, InferCompression::High);
        assert!(grpc.header_forward.is_enabled());
        assert!(
            c.frontend
                .http_config(1, Default::default())
                .header_forward
                .is_enabled()
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_flag() {
        let e = parse(&["--http-header-forward-pattern", "(open"]).unwrap_err();
        assert!(
            e.contains("--http-header-forward-pattern is not a valid regular expression"),
            "{e}"
        );
        let e = parse(&["--grpc-infer-response-compression-level", "max"]).unwrap_err();
        assert!(
            e.contains("expected none, low, medium or high, got 'max'"),
            "{e}"
        );
    }
}
