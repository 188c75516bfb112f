//! In-process libtorch (TorchScript) throughput through `tch`, the baseline the PyTorch backend
//! is measured against in `scripts/bench_torch.sh`: one module, inputs prepared once,
//! `forward_ts` in a loop without autograd (as the backend's instances run it).
//!
//! usage:
//!   inprocess_torch write-model OUT.pt
//!       traces the benchmark MLP (FP32 [-1,256] -> 1024 -> 1024 -> 256, ReLU, fixed seed) from
//!       Rust and saves it as TorchScript; no Python torch needed.
//!   inprocess_torch run MODEL.pt BATCHES(comma) SECONDS [THREADS...]
//!       for each intra-op thread count (default: libtorch's own) and batch size, prints one
//!       JSON object: {"batch", "threads", "infer_per_sec", "runs", "p50_us"}

use std::time::{Duration, Instant};

use tch::nn::Module;
use tch::{CModule, Device, Kind, Tensor, nn};

const WIDTH: i64 = 256;
const HIDDEN: i64 = 1024;
const SEED: i64 = 20261122;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("write-model") if args.len() == 3 => write_model(&args[2]),
        Some("run") if args.len() >= 5 => {
            let batches: Vec<i64> = args[3]
                .split(',')
                .map(str::parse)
                .collect::<Result<_, _>>()?;
            let seconds: f64 = args[4].parse()?;
            let threads: Vec<i32> = args[5..]
                .iter()
                .map(|s| s.parse())
                .collect::<Result<_, _>>()?;
            run(&args[2], &batches, seconds, &threads)
        }
        _ => Err(
            "usage: inprocess_torch write-model OUT.pt | run MODEL.pt BATCHES SECONDS [THREADS...]"
                .into(),
        ),
    }
}

/// Builds the MLP with a fixed seed, traces it and saves the TorchScript archive; then loads
/// it back and checks that it gives the same output as the eager network.
fn write_model(path: &str) -> Result<(), Box<dyn std::error::Error>> {
    tch::manual_seed(SEED);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let net = nn::seq()
        .add(nn::linear(&root / "fc1", WIDTH, HIDDEN, Default::default()))
        .add_fn(|x| x.relu())
        .add(nn::linear(
            &root / "fc2",
            HIDDEN,
            HIDDEN,
            Default::default(),
        ))
        .add_fn(|x| x.relu())
        .add(nn::linear(&root / "fc3", HIDDEN, WIDTH, Default::default()));
    // Weights become constants of the traced graph, which libtorch refuses while they
    // require grad.
    vs.freeze();
    let _guard = tch::no_grad_guard();
    let example = Tensor::randn([4, WIDTH], (Kind::Float, Device::Cpu));
    let mut forward = |inputs: &[Tensor]| vec![net.forward(&inputs[0])];
    let traced = CModule::create_by_tracing(
        "MlpTorch",
        "forward",
        &[example.shallow_clone()],
        &mut forward,
    )?;
    traced.save(path)?;

    let loaded = CModule::load(path)?;
    let check = Tensor::randn([3, WIDTH], (Kind::Float, Device::Cpu));
    let got = loaded.forward_ts(&[&check])?;
    let want = net.forward(&check);
    if got.size() != [3, WIDTH] || !got.allclose(&want, 1e-5, 1e-6, false) {
        return Err(format!("{path}: reloaded module disagrees with the eager network").into());
    }
    eprintln!(
        "wrote {path} (TorchScript, reloaded and checked; output {:?})",
        got.size()
    );
    Ok(())
}

fn run(
    path: &str,
    batches: &[i64],
    seconds: f64,
    threads: &[i32],
) -> Result<(), Box<dyn std::error::Error>> {
    tch::jit::set_graph_executor_optimize(true);
    let mut module = CModule::load_on_device(path, Device::Cpu)?;
    module.f_set_eval()?;
    let _guard = tch::no_grad_guard();
    let default_threads = [tch::get_num_threads()];
    let threads = if threads.is_empty() {
        &default_threads[..]
    } else {
        threads
    };
    for &n in threads {
        tch::set_num_threads(n);
        for &batch in batches {
            let data: Vec<f32> = (0..batch * WIDTH).map(|i| (i % 17) as f32 / 17.0).collect();
            let input = Tensor::from_slice(&data).reshape([batch, WIDTH]);
            // Warm up (the profiling executor optimises after a few runs), then measure.
            for _ in 0..10 {
                let _ = module.forward_ts(&[&input])?;
            }
            let mut latencies = Vec::new();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs_f64(seconds) {
                let t = Instant::now();
                let output = module.forward_ts(&[&input])?;
                drop(output);
                latencies.push(t.elapsed());
            }
            let elapsed = started.elapsed().as_secs_f64();
            latencies.sort();
            let p50 = latencies
                .get(latencies.len() / 2)
                .copied()
                .unwrap_or_default();
            println!(
                "{{\"batch\": {batch}, \"threads\": {n}, \"infer_per_sec\": {:.1}, \"runs\": {}, \"p50_us\": {}}}",
                (latencies.len() as i64 * batch) as f64 / elapsed,
                latencies.len(),
                p50.as_micros()
            );
        }
    }
    Ok(())
}
