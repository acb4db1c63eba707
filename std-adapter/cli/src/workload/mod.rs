//! The built-in workload: a deterministic generator of LLM-server-like kvtrace traffic.
//!
//! [`Generator`] makes the records of a [`GeneratorConfig`] in memory bounded by its
//! parameters (never by the number of requests); the same config gives the same trace on every
//! target and every release. It is a [`RecordSource`], so a replay takes it as it takes a
//! [`TraceReader`](crate::trace::TraceReader), and [`TraceWriter`](crate::trace::TraceWriter)
//! writes its records as a kvtrace file.
//!
//! ```
//! use kvtier_cli::trace::{TraceReader, TraceWriter};
//! use kvtier_cli::workload::{Generator, GeneratorConfig};
//! let mut config = GeneratorConfig::new(7, 100);
//! config.inflight = 4;
//! let mut generator = Generator::new(config)?;
//! let mut file = Vec::new();
//! let mut writer = TraceWriter::new(&mut file, generator.header())?;
//! while let Some(record) = generator.next_record() {
//!     writer.write_record(&record)?;
//! }
//! writer.finish()?;
//!
//! let mut reader = TraceReader::new(file.as_slice())?;
//! let mut records = 0;
//! while reader.next_record()?.is_some() {
//!     records += 1;
//! }
//! assert_eq!(records, 300);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod cdf;
mod config;
mod generator;
mod rng;

pub use config::{
    BlockRange, BlockRangeParseError, GeneratorConfig, GeneratorError, MAX_HELD_HASHES,
    MAX_PREFIXES, MAX_RECENT_OR_INFLIGHT, MAX_ZIPF_S, RangeParam,
};
pub use generator::{Generator, OwnedRecords};

use crate::trace::{Header, Record, RecordSource};

impl RecordSource for Generator {
    type Error = core::convert::Infallible;

    fn header(&self) -> &Header {
        Generator::header(self)
    }

    fn next_record(&mut self) -> Result<Option<Record<'_>>, core::convert::Infallible> {
        Ok(Generator::next_record(self))
    }

    fn line(&self) -> Option<u64> {
        None
    }
}
