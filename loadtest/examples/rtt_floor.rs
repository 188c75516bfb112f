//! The latency floor of this machine, for reading `identity` round trips against it.
//!
//! Measures, one request outstanding at a time:
//! 1. a 64-byte TCP ping-pong over loopback between two threads of this process (blocking
//!    sockets, `TCP_NODELAY`): the cost of two cross-CPU wake-ups and the kernel's TCP path;
//! 2. with a gRPC address given, the `ServerLive` RPC of a running KServe v2 server through
//!    tonic on a single-threaded runtime: the transport stack with no inference behind it.
//!
//! usage: cargo run --release -p nereid-loadtest --example rtt_floor [-- HOST:PORT] [ITERATIONS]
//! Prints one JSON line per measurement: {"what", "iterations", "p50_us", "p90_us", "p99_us"}.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use nereid_proto::pb::inference::ServerLiveRequest;
use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let grpc = args.iter().find(|a| a.contains(':')).cloned();
    let iterations: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(20_000);

    report("tcp_pingpong_64B", tcp_pingpong(iterations)?);
    if let Some(addr) = grpc {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let samples = runtime.block_on(grpc_live(&addr, iterations))?;
        report("grpc_server_live", samples);
    }
    Ok(())
}

fn tcp_pingpong(iterations: usize) -> anyhow::Result<Vec<u64>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        loop {
            if s.read_exact(&mut buf).is_err() {
                return Ok(());
            }
            s.write_all(&buf)?;
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let mut buf = [7u8; 64];
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations + iterations / 10 {
        let start = Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut buf)?;
        if i >= iterations / 10 {
            samples.push(start.elapsed().as_nanos() as u64);
        }
    }
    drop(s);
    let _ = echo.join();
    Ok(samples)
}

async fn grpc_live(addr: &str, iterations: usize) -> anyhow::Result<Vec<u64>> {
    let endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true);
    let mut client = GrpcInferenceServiceClient::new(endpoint.connect().await?);
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations + iterations / 10 {
        let start = Instant::now();
        client.server_live(ServerLiveRequest {}).await?;
        if i >= iterations / 10 {
            samples.push(start.elapsed().as_nanos() as u64);
        }
    }
    Ok(samples)
}

fn report(what: &str, mut samples: Vec<u64>) {
    samples.sort_unstable();
    let pct = |p: f64| samples[((samples.len() as f64 * p) as usize).min(samples.len() - 1)] / 1000;
    println!(
        "{{\"what\": \"{what}\", \"iterations\": {}, \"p50_us\": {}, \"p90_us\": {}, \"p99_us\": {}}}",
        samples.len(),
        pct(0.5),
        pct(0.9),
        pct(0.99)
    );
}
