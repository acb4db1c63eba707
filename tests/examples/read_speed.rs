//! Throughput of the kvtrace reader on a 1,000,000-record round trip: the generator writes a
//! file, the reader reads it back five times and the median is printed (figures are printed,
//! never asserted; the counts are checked).
//!
//! `cargo run --release -p kvtier-tests --example read_speed`

use std::io::{BufReader, Write};
use std::time::Instant;

use kvtier_cli::trace::{TraceReader, TraceWriter};
use kvtier_cli::workload::{Generator, GeneratorConfig};

#[expect(clippy::cast_precision_loss, reason = "rates for people")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path =
        std::env::temp_dir().join(format!("kvtier-read-speed-{}.kvtrace", std::process::id()));
    let config = GeneratorConfig::new(1, 333_334);
    let started = Instant::now();
    let mut generator = Generator::new(config)?;
    let file = std::io::BufWriter::new(std::fs::File::create(&path)?);
    let mut writer = TraceWriter::new(file, generator.header())?;
    let mut written = 0u64;
    while let Some(record) = generator.next_record() {
        writer.write_record(&record)?;
        written += 1;
    }
    writer.finish()?.flush()?;
    let write_s = started.elapsed().as_secs_f64();
    let bytes = std::fs::metadata(&path)?.len();

    let mut secs = Vec::new();
    let mut blocks = 0;
    for _ in 0..5 {
        let started = Instant::now();
        let file = std::fs::File::open(&path)?;
        let mut reader = TraceReader::new(BufReader::with_capacity(1 << 16, file))?;
        let mut records = 0u64;
        while reader.next_record()?.is_some() {
            records += 1;
        }
        secs.push(started.elapsed().as_secs_f64());
        if records != written {
            return Err(format!("read {records} records of {written}").into());
        }
        blocks = reader.blocks_read();
    }
    std::fs::remove_file(&path)?;
    secs.sort_by(f64::total_cmp);
    let median = secs[secs.len() / 2];
    println!(
        "generate+write: {written} records, {bytes} bytes, {blocks} blocks in {write_s:.3} s \
         ({:.2} M records/s, {:.0} MB/s)",
        written as f64 / write_s / 1e6,
        bytes as f64 / write_s / 1e6
    );
    println!(
        "read (median of 5: {secs:.3?}): {median:.3} s, {:.2} M records/s, {:.0} MB/s, {:.1} M blocks/s",
        written as f64 / median / 1e6,
        bytes as f64 / median / 1e6,
        blocks as f64 / median / 1e6
    );
    Ok(())
}
