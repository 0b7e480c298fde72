//! What every report shares: when and where it was measured, and how it is written.

use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;

/// Now, as the reports write it (`2026-11-24 18:30 UTC`), from the system clock.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    hillside_engine::text::chat::strftime("%Y-%m-%d %H:%M UTC", secs)
}

/// The CPU's model name, as `/proc/cpuinfo` gives it.
pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The most memory this process has held, in MB.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib * 1024.0 / 1e6)
}

/// Writes a report as pretty JSON, ending in a newline.
pub fn write_json(path: &Path, report: &impl Serialize) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(report)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// One of `../shared/data`'s documents, found from this crate rather than the working
/// directory, so that a default works wherever the command runs.
pub fn shared_document(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_date_reads_as_the_system_clock_says() {
        let now = utc_now();
        let date = std::process::Command::new("date").args(["-u", "+%Y-%m-%d"]).output().unwrap();
        assert!(now.starts_with(String::from_utf8_lossy(&date.stdout).trim()), "{now}");
        assert!(now.ends_with(" UTC") && now.len() == "2026-11-24 18:30 UTC".len(), "{now}");
    }

    #[test]
    fn the_shared_documents_are_found_from_anywhere() {
        assert!(shared_document("gpl-3.0.txt").is_file(), "{}", shared_document("gpl-3.0.txt").display());
    }
}
