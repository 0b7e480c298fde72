//! How much memory this process could still use without pushing anything out: the system's
//! MemAvailable, and the room left under the memory limit of every cgroup the process is in
//! (v2 `memory.max`, v1 `memory.limit_in_bytes`; reclaimable file cache counted as room), with
//! the system's memory pressure (PSI). The cold pool reads through the page cache only while
//! this says the cache has room (DUAL-BLADE's dual path), so the decision follows measured
//! pressure, not a flag.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Headroom {
    /// The least of MemAvailable and every enclosing cgroup's room.
    pub bytes: u64,
    /// Whether a cgroup limit set it (rather than the whole machine's memory).
    pub cgroup_limited: bool,
    /// Share of the last 10 s some task stalled on memory, in hundredths of a percent.
    pub pressure_some_bp: u32,
}

impl Headroom {
    /// Measures it now (a few small reads from /proc and /sys).
    pub fn measure() -> Self {
        let system = meminfo_available().unwrap_or(0);
        let cgroup = cgroup_dirs().into_iter().filter_map(|d| d.room()).min();
        let pressure_some_bp =
            std::fs::read_to_string("/proc/pressure/memory").ok().and_then(|s| psi_some_avg10_bp(&s)).unwrap_or(0);
        match cgroup {
            Some(room) if room < system => Self { bytes: room, cgroup_limited: true, pressure_some_bp },
            _ => Self { bytes: system, cgroup_limited: false, pressure_some_bp },
        }
    }
}

/// How long a decision taken on a measurement stands before memory is measured again.
pub const REMEASURE_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Memory left alone whatever the headroom: for the process's own growth and everyone else.
pub const HEADROOM_RESERVE_BYTES: u64 = 256 << 20;

/// Memory stalls (PSI `some avg10`, hundredths of a percent) at which nothing more is taken:
/// every cold read goes direct and a tiered store lets its spare copy go.
pub const PRESSURE_LIMIT_BP: u32 = 1000;

fn meminfo_available() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// `some avg10=X` of a PSI file, in hundredths of a percent.
fn psi_some_avg10_bp(psi: &str) -> Option<u32> {
    let line = psi.lines().find(|l| l.starts_with("some "))?;
    let avg10 = line.split_whitespace().find_map(|f| f.strip_prefix("avg10="))?;
    Some((avg10.parse::<f64>().ok()? * 100.0).round() as u32)
}

/// A memory cgroup directory and its version.
#[derive(Debug)]
struct CgroupDir {
    path: PathBuf,
    v2: bool,
}

impl CgroupDir {
    /// The limit less the usage, plus the inactive file cache the kernel would reclaim first;
    /// `None` without a limit.
    fn room(&self) -> Option<u64> {
        let read = |name: &str| std::fs::read_to_string(self.path.join(name)).ok();
        let (limit, usage, inactive_key) = if self.v2 {
            (
                read("memory.max")?.trim().parse::<u64>().ok()?,
                read("memory.current")?.trim().parse::<u64>().ok()?,
                "inactive_file",
            )
        } else {
            (
                read("memory.limit_in_bytes")?.trim().parse::<u64>().ok()?,
                read("memory.usage_in_bytes")?.trim().parse::<u64>().ok()?,
                "total_inactive_file",
            )
        };
        if limit >= UNLIMITED {
            return None;
        }
        let inactive = read("memory.stat").and_then(|s| stat_value(&s, inactive_key)).unwrap_or(0);
        Some(limit.saturating_sub(usage) + inactive.min(usage))
    }
}

fn stat_value(stat: &str, key: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Limits at or above this mean "none" (v1 writes the largest page-aligned i64).
const UNLIMITED: u64 = 1 << 60;

/// The memory cgroup directories of this process and of their ancestors.
fn cgroup_dirs() -> Vec<CgroupDir> {
    let Ok(membership) = std::fs::read_to_string("/proc/self/cgroup") else { return Vec::new() };
    let mut dirs = Vec::new();
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else { continue };
        let (roots, v2): (&[&str], bool) = match (id, controllers) {
            ("0", "") => (&["/sys/fs/cgroup", "/sys/fs/cgroup/unified"], true),
            (_, c) if c.split(',').any(|c| c == "memory") => (&["/sys/fs/cgroup/memory"], false),
            _ => continue,
        };
        for root in roots {
            let mut dir = Path::new(root).join(path.trim_start_matches('/'));
            loop {
                dirs.push(CgroupDir { path: dir.clone(), v2 });
                if dir.as_path() == Path::new(root) || !dir.pop() {
                    break;
                }
            }
        }
    }
    dirs
}

/// A memory cgroup made for a child process (tests and `hillside bench kv --memory-cap-mb`):
/// v2 where this process's cgroup tree delegates the memory controller, else v1. Removed when
/// dropped (once its processes have ended).
pub struct MemoryCap {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCap {
    /// A new cgroup beside this process's own, limited to `limit_bytes`.
    pub fn create(name: &str, limit_bytes: u64) -> std::io::Result<Self> {
        let membership = std::fs::read_to_string("/proc/self/cgroup")?;
        let own = |pick: &dyn Fn(&str, &str) -> bool| {
            membership.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (id, c, p) = (f.next()?, f.next()?, f.next()?);
                pick(id, c).then(|| p.trim_start_matches('/').to_string())
            })
        };
        let unique = format!("{name}-{}", std::process::id());
        let v2_root = own(&|id, c| id == "0" && c.is_empty()).map(|p| Path::new("/sys/fs/cgroup").join(p));
        if let Some(parent) = v2_root
            .filter(|p| std::fs::read_to_string(p.join("cgroup.subtree_control")).is_ok_and(|s| s.contains("memory")))
        {
            let dir = parent.join(unique);
            std::fs::create_dir(&dir)?;
            std::fs::write(dir.join("memory.max"), limit_bytes.to_string())?;
            return Ok(Self { dir, v2: true });
        }
        let v1 = own(&|_, c| c.split(',').any(|c| c == "memory")).ok_or_else(|| {
            std::io::Error::other("no memory cgroup controller (neither v2 delegated nor v1 mounted)")
        })?;
        let dir = Path::new("/sys/fs/cgroup/memory").join(v1).join(unique);
        std::fs::create_dir(&dir)?;
        std::fs::write(dir.join("memory.limit_in_bytes"), limit_bytes.to_string())?;
        Ok(Self { dir, v2: false })
    }

    /// Changes the limit.
    pub fn set_limit(&self, limit_bytes: u64) -> std::io::Result<()> {
        std::fs::write(
            self.dir.join(if self.v2 { "memory.max" } else { "memory.limit_in_bytes" }),
            limit_bytes.to_string(),
        )
    }

    /// Moves process `pid` into the cgroup.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
    }
}

impl Drop for MemoryCap {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not remove a memory cgroup");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_and_stat_lines_parse() {
        let psi = "some avg10=12.34 avg60=1.00 avg300=0.00 total=5\nfull avg10=0.50 avg60=0.00 avg300=0.00 total=1\n";
        assert_eq!(psi_some_avg10_bp(psi), Some(1234));
        assert_eq!(stat_value("cache 10\ntotal_inactive_file 4096\ninactive_file 7\n", "inactive_file"), Some(7));
        assert_eq!(stat_value("total_inactive_file 4096\n", "total_inactive_file"), Some(4096));
        let now = Headroom::measure();
        assert!(now.bytes > 0, "MemAvailable is always there: {now:?}");
    }
}
