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
pub(in crate::kv) fn read_heads(cold: &ColdPool, layer: usize, groups: Vec<Vec<usize>>, buf: &mut AlignedBuf) -> Result<Staged> {
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
    match cold.read_runs(layer, &mut runs) {
        Some(read) => read?,
        None => io_pool().install(|| {
            use rayon::prelude::*;
            runs.into_par_iter().try_for_each(|mut run| cold.read_run(layer, &mut run))
        })?,
    }
    Ok(staged)
}

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
