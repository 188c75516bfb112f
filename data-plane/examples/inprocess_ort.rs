//! In-process ONNX Runtime throughput through `ort`, the baseline the server is measured
//! against in `make bench`: one session, inputs prepared once, `Session::run` in a loop.
//!
//! usage: inprocess_ort LIBRARY MODEL.onnx INPUT_NAME DIMS(comma) BATCHES(comma) SECONDS [INTRA_THREADS]
//! prints one JSON object per batch size: {"batch", "infer_per_sec", "runs", "p50_us"}

use std::time::{Duration, Instant};

use ort::session::Session;
use ort::value::TensorRef;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 7 {
        return Err(
            "usage: inprocess_ort LIBRARY MODEL INPUT DIMS BATCHES SECONDS [INTRA_THREADS]".into(),
        );
    }
    let dims: Vec<i64> = args[4]
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let batches: Vec<usize> = args[5]
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let seconds: f64 = args[6].parse()?;
    let threads: usize = args.get(7).map(|s| s.parse()).transpose()?.unwrap_or(1);
    let environment = ort::init_from(&args[1])?
        .with_name("inprocess-bench")
        .build()?;
    let mut session = Session::builder(&environment)?
        .with_intra_threads(threads)?
        .commit_from_file(&args[2])?;
    let row: usize = dims.iter().product::<i64>() as usize;
    for batch in batches {
        let data: Vec<f32> = (0..batch * row).map(|i| (i % 17) as f32 / 17.0).collect();
        let mut shape = vec![batch as i64];
        shape.extend_from_slice(&dims);
        // Warm up, then measure.
        for _ in 0..3 {
            let input = TensorRef::from_array_view((shape.clone(), &data[..]))?;
            session.run(ort::inputs![args[3].as_str() => input])?;
        }
        let mut latencies = Vec::new();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs_f64(seconds) {
            let t = Instant::now();
            let input = TensorRef::from_array_view((shape.clone(), &data[..]))?;
            let outputs = session.run(ort::inputs![args[3].as_str() => input])?;
            drop(outputs);
            latencies.push(t.elapsed());
        }
        let elapsed = started.elapsed().as_secs_f64();
        latencies.sort();
        let p50 = latencies
            .get(latencies.len() / 2)
            .copied()
            .unwrap_or_default();
        println!(
            "{{\"batch\": {batch}, \"infer_per_sec\": {:.1}, \"runs\": {}, \"p50_us\": {}}}",
            (latencies.len() * batch) as f64 / elapsed,
            latencies.len(),
            p50.as_micros()
        );
    }
    Ok(())
}
