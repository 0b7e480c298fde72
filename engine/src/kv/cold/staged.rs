//! Reading a layer's cold groups into memory as the pool keeps them, for every store that reads
//! the pool back (tiered, near-storage): one request per run of consecutive groups, many in
//! flight at once.
//!
//! Groups are staged as the pool keeps them ([`Staging::AsKept`]): a q8 group takes 2,560 bytes
//! instead of its 4,096 decoded, and the rows a view uses are decoded as they are copied in.

use super::{ColdPool, GroupRun, Staging};
use crate::error::Result;
use crate::kv::aligned::AlignedBuf;
use std::sync::OnceLock;

/// The groups read for one layer, per head, laid out head after head in some buffer.
#[derive(Debug, Default)]
pub(in crate::kv) struct Staged {
    heads: Vec<StagedHead>,
}

#[derive(Debug)]
struct StagedHead {
    /// Groups read (ascending).
    groups: Vec<usize>,
    /// Where the first one starts in the buffer, in bytes.
    offset: usize,
}

impl Staged {
    /// Group `group` of `head` as the pool keeps it (`group_bytes` long), if it was read into
    /// `buf`.
    pub fn group<'a>(&self, buf: &'a AlignedBuf, head: usize, group: usize, group_bytes: usize) -> Option<&'a [u8]> {
        let h = self.heads.get(head)?;
        let i = h.groups.binary_search(&group).ok()?;
        Some(&buf.as_bytes()[h.offset + i * group_bytes..][..group_bytes])
    }

    /// `head`'s groups in `buf`, indexed for lookups by the thousand.
    pub fn head_pages<'a>(&self, buf: &'a AlignedBuf, head: usize, group_bytes: usize) -> HeadPages<'a> {
        let Some(h) = self.heads.get(head) else { return HeadPages { bytes: &[], group_bytes, at: Vec::new() } };
        let mut at = vec![0u32; h.groups.last().map_or(0, |&g| g + 1)];
        h.groups.iter().enumerate().for_each(|(i, &g)| at[g] = i as u32 + 1);
        HeadPages { bytes: &buf.as_bytes()[h.offset..][..h.groups.len() * group_bytes], group_bytes, at }
    }
}

/// One head's staged groups, by group number (see [`Staged::head_pages`]).
pub(in crate::kv) struct HeadPages<'a> {
    bytes: &'a [u8],
    group_bytes: usize,
    /// `[group]`: 1 + its place among the staged groups, or 0 where it was not read.
    at: Vec<u32>,
}

impl<'a> HeadPages<'a> {
    /// Group `group` as the pool keeps it, if it was read.
    pub fn get(&self, group: usize) -> Option<&'a [u8]> {
        let i = (*self.at.get(group)?).checked_sub(1)? as usize;
        Some(&self.bytes[i * self.group_bytes..][..self.group_bytes])
    }
}

/// Reads each head's `groups` (ascending) of `layer` into `buf` (grown if too small), head after
/// head, as the pool keeps them: one request per run of consecutive groups, many in flight at
/// once (an SSD needs a deep queue for its random-read rate): through this thread's io_uring,
/// or where there is none from the I/O threads.
pub(in crate::kv) fn read_heads(
    cold: &ColdPool,
    layer: usize,
    groups: Vec<Vec<usize>>,
    buf: &mut AlignedBuf,
) -> Result<Staged> {
    let total: usize = groups.iter().map(Vec::len).sum();
    read_heads_in_parts(cold, layer, groups, buf, read_parts(total * cold.layout().disk_group_bytes()))
}

/// [`read_heads`], its requests shared by `parts` I/O threads.
fn read_heads_in_parts(
    cold: &ColdPool,
    layer: usize,
    groups: Vec<Vec<usize>>,
    buf: &mut AlignedBuf,
    parts: usize,
) -> Result<Staged> {
    let gb = cold.layout().disk_group_bytes();
    let total: usize = groups.iter().map(Vec::len).sum();
    if buf.len() < total * gb {
        *buf = AlignedBuf::zeroed(total * gb);
    }
    let mut staged = Staged { heads: Vec::with_capacity(groups.len()) };
    let mut offset = 0;
    for g in groups {
        let n = g.len();
        staged.heads.push(StagedHead { groups: g, offset });
        offset += n * gb;
    }
    if total == 0 {
        return Ok(staged); // nothing cold: no hand-off to the I/O threads
    }
    let mut rest = &mut buf.as_bytes_mut()[..total * gb];
    let mut runs = Vec::new();
    for (head, s) in staged.heads.iter().enumerate() {
        let mut i = 0;
        while i < s.groups.len() {
            let mut j = i + 1;
            while j < s.groups.len() && s.groups[j] == s.groups[j - 1] + 1 {
                j += 1;
            }
            let (dst, tail) = rest.split_at_mut((j - i) * gb);
            runs.push(GroupRun { head, first: s.groups[i], count: j - i, dst, staging: Staging::AsKept });
            rest = tail;
            i = j;
        }
    }
    use rayon::prelude::*;
    if parts > 1 {
        let per_part = runs.len().div_ceil(parts);
        io_pool().install(|| runs.par_chunks_mut(per_part).try_for_each(|part| read_all(cold, layer, part)))?;
        return Ok(staged);
    }
    match cold.read_runs(layer, &mut runs) {
        Some(read) => read?,
        None => io_pool().install(|| runs.into_par_iter().try_for_each(|mut run| cold.read_run(layer, &mut run)))?,
    }
    Ok(staged)
}

/// Reads `runs` from this thread: through its io_uring, or one by one where it has none.
fn read_all(cold: &ColdPool, layer: usize, runs: &mut [GroupRun<'_>]) -> Result<()> {
    cold.read_runs(layer, runs).unwrap_or_else(|| runs.iter_mut().try_for_each(|run| cold.read_run(layer, run)))
}

/// How many I/O threads share a read of `bytes`. Through the page cache, io_uring copies the
/// whole read (and the checksums are checked) on the one thread that submits it, which on a
/// machine with many cores leaves the step waiting on one of them. On a few cores the copies
/// would only take turns with the step's own work, so a read stays whole there.
fn read_parts(bytes: usize) -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
    if bytes < SPLIT_READ_BYTES || cores < SPLIT_MIN_CORES {
        return 1;
    }
    (cores / 4).min(MAX_READ_PARTS)
}

/// Reads smaller than this are not split.
const SPLIT_READ_BYTES: usize = 1 << 20;
/// Cores from which reads are split ([`read_parts`]).
const SPLIT_MIN_CORES: usize = 8;
const MAX_READ_PARTS: usize = 4;

/// Threads that issue cold-pool requests where there is no io_uring (and the spills' writes):
/// blocking system calls, so more threads than cores means more requests in flight.
pub(crate) fn io_pool() -> &'static rayon::ThreadPool {
    static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(IO_THREADS)
            .thread_name(|i| format!("hillside-io-{i}"))
            .build()
            .expect("starting the cold-pool I/O threads")
    })
}

/// Reads in flight at once against the cold pool.
const IO_THREADS: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::cold::ColdLayout;
    use crate::kv::fault::{self, ColdFaults, FailingRead};
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn a_read_shared_by_threads_stages_what_one_thread_would_and_fails_as_one() {
        let scratch = tempfile::Builder::new().prefix("hillside-staged-parts-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        // Armed below, once the pool is written: a pool takes its faults when it is created.
        let plan = fault::inject(
            &dir,
            ColdFaults {
                failing_read: Some(FailingRead { layer: 1, errno: libc::EIO, times: AtomicUsize::new(0) }),
                ..ColdFaults::default()
            },
        );
        let layout = ColdLayout::f16(2, 3, 16, 40);
        let cold = ColdPool::create(&dir, layout).unwrap();
        let mut page = cold.buffer(1);
        for (layer, head, group) in (0..2).flat_map(|l| (0..3).flat_map(move |h| (0..40).map(move |g| (l, h, g)))) {
            page.as_u16_mut()
                .iter_mut()
                .enumerate()
                .for_each(|(i, w)| *w = (layer * 10_000 + head * 1000 + group * 10 + i % 7) as u16);
            cold.write_group(layer, head, group, &page).unwrap();
        }
        // Runs of every length, and heads with none.
        let groups = vec![vec![0, 1, 2, 5, 9, 10, 30], vec![], vec![3, 4, 7, 8, 11, 12, 13, 14, 39]];
        let staged_bytes = |parts: usize| {
            let mut buf = AlignedBuf::zeroed(0);
            let staged = read_heads_in_parts(&cold, 1, groups.clone(), &mut buf, parts).unwrap();
            let gb = layout.disk_group_bytes();
            let bytes: Vec<Vec<u8>> = (0..3)
                .flat_map(|h| (0..40).map(move |g| (h, g)))
                .filter_map(|(h, g)| staged.group(&buf, h, g, gb).map(<[u8]>::to_vec))
                .collect();
            assert_eq!(bytes.len(), 16, "{parts} parts: every group asked for is staged");
            bytes
        };
        let whole = staged_bytes(1);
        assert_eq!(u16::from_le_bytes([whole[0][2], whole[0][3]]), 10_001, "layer 1, head 0, group 0, word 1");
        for parts in [2, 3, 4] {
            assert_eq!(staged_bytes(parts), whole, "{parts} parts");
        }
        // A failure in any part fails the read, with the pool's error.
        plan.failing_read.as_ref().unwrap().times.store(1, Ordering::Relaxed);
        let error = read_heads_in_parts(&cold, 1, groups.clone(), &mut AlignedBuf::zeroed(0), 3).unwrap_err();
        assert!(error.to_string().contains("read failed"), "{error}");
        assert!(read_heads_in_parts(&cold, 1, groups, &mut AlignedBuf::zeroed(0), 3).is_ok(), "the fault was used up");
        fault::clear(&dir);
        drop(cold);
    }
}
