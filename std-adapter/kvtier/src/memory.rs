//! The machine's available memory, the default memory limit of the managers the command line
//! builds ([`ManagerConfig::memory_limit`](kvtier_core::manager::ManagerConfig::memory_limit)).

/// Bytes the kernel reports as available for new allocations without swapping (`MemAvailable`
/// in `/proc/meminfo`); `None` where that is unknown (not Linux, or the file cannot be read).
#[must_use]
pub fn available_bytes() -> Option<u64> {
    if cfg!(target_os = "linux") {
        parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
    } else {
        None
    }
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
#[must_use]
pub fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib = line.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_available_in_bytes() {
        let text = "MemTotal:       16384000 kB\nMemFree:  100 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(parse_mem_available(text), Some(8_192_000_000));
        assert_eq!(parse_mem_available("MemFree: 1 kB\n"), None);
        assert_eq!(parse_mem_available("MemAvailable: lots\n"), None);
    }
}
