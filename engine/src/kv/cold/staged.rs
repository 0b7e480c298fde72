//! Reading a layer's cold groups into memory as the pool keeps them, for every store that reads
//! the pool back (tiered, near-storage): one request per run of consecutive groups, many in
//! flight at once.
//!
//! Groups are staged as the pool keeps them ([`Staging::AsKept`]): a q8 group takes 2,560 bytes
//! instead of its 4,096 decoded, and the rows a view uses are decoded as they are copied in.
//! Groups the page cache already holds, of lanes read through it, are not copied at all: they
//! are read in place ([`ColdPool::take_in_cache`]), each checked where it lies when it is first
//! asked for.
//!
//! The pool's owner never rewrites a group while a read of it is staged: a step's reads are
//! claimed or dropped before it commits, and truncations and re-placements wait for reads in
//! flight. So the groups read in place hold still for as long as a `Staged` is in use.

use super::{ColdPool, GroupRun, Staging};
use crate::aligned::AlignedBuf;
use crate::error::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The groups read for one layer, per head: copied head after head into some buffer, or read
/// in place.
#[derive(Debug, Default)]
pub(in crate::kv) struct Staged {
    layer: usize,
    heads: Vec<StagedHead>,
}

#[derive(Debug)]
struct StagedHead {
    /// Groups copied into the buffer (ascending).
    groups: Vec<usize>,
    /// Where the first one starts in the buffer, in bytes.
    offset: usize,
    /// Groups read in place (ascending), each with where it lies in the lane's region.
    in_place: Vec<(usize, usize)>,
}

/// [`HeadPages::at`]'s mark for a group read in place; the rest of the word is where it lies in
/// the lane's region.
const IN_PLACE: u32 = 1 << 31;

impl Staged {
    /// Group `group` of `head` as the pool keeps it, if it was read (into `buf`, or in place:
    /// then checked against its checksum).
    pub fn group<'a>(
        &self,
        cold: &'a ColdPool,
        buf: &'a AlignedBuf,
        head: usize,
        group: usize,
    ) -> Result<Option<&'a [u8]>> {
        let (Some(h), gb) = (self.heads.get(head), cold.layout().disk_group_bytes()) else { return Ok(None) };
        if let Ok(i) = h.groups.binary_search(&group) {
            return Ok(Some(&buf.as_bytes()[h.offset + i * gb..][..gb]));
        }
        let Ok(i) = h.in_place.binary_search_by_key(&group, |&(g, _)| g) else { return Ok(None) };
        cold.group_in_place(self.layer, head, group, h.in_place[i].1).map(Some)
    }

    /// `head`'s groups (in `buf`, or in place), indexed for lookups by the thousand.
    pub fn head_pages<'a>(&self, cold: &'a ColdPool, buf: &'a AlignedBuf, head: usize) -> HeadPages<'a> {
        let group_bytes = cold.layout().disk_group_bytes();
        let Some(h) = self.heads.get(head) else {
            let (staged, lane, at, checked) = (&[][..], &[][..], Vec::new(), Vec::new());
            return HeadPages { cold, layer: self.layer, head, staged, lane, group_bytes, at, checked };
        };
        let end = h.groups.last().into_iter().chain(h.in_place.last().map(|(g, _)| g)).max().map_or(0, |&g| g + 1);
        let mut at = vec![0u32; end];
        h.groups.iter().enumerate().for_each(|(i, &g)| at[g] = i as u32 + 1);
        h.in_place.iter().for_each(|&(g, physical)| at[g] = IN_PLACE | physical as u32);
        HeadPages {
            cold,
            layer: self.layer,
            head,
            staged: &buf.as_bytes()[h.offset..][..h.groups.len() * group_bytes],
            lane: if h.in_place.is_empty() { &[] } else { cold.lane_in_place(self.layer, head) },
            group_bytes,
            checked: (0..if h.in_place.is_empty() { 0 } else { end.div_ceil(64) }).map(|_| AtomicU64::new(0)).collect(),
            at,
        }
    }
}

/// One head's groups read, by group number (see [`Staged::head_pages`]). The threads copying
/// rows out of them share it.
pub(in crate::kv) struct HeadPages<'a> {
    cold: &'a ColdPool,
    layer: usize,
    head: usize,
    staged: &'a [u8],
    /// The head's region of the pool as the page cache holds it, where groups were read in place.
    lane: &'a [u8],
    group_bytes: usize,
    /// `[group]`: 1 + its place among the staged groups, [`IN_PLACE`] with where it lies in
    /// `lane`, or 0 where it was not read.
    at: Vec<u32>,
    /// A bit per group read in place that was checked against its checksum.
    checked: Vec<AtomicU64>,
}

impl<'a> HeadPages<'a> {
    /// Group `group` as the pool keeps it, if it was read. A group read in place is checked
    /// against its checksum the first time it is asked for (two threads asking at once may
    /// both check it).
    pub fn get(&self, group: usize) -> Result<Option<&'a [u8]>> {
        let at = self.at.get(group).copied().unwrap_or(0);
        if at & IN_PLACE == 0 {
            let i = at as usize;
            return Ok((i > 0).then(|| &self.staged[(i - 1) * self.group_bytes..][..self.group_bytes]));
        }
        let physical = (at & !IN_PLACE) as usize;
        let bytes = &self.lane[physical * self.group_bytes..][..self.group_bytes];
        let (word, bit) = (&self.checked[group / 64], 1 << (group % 64));
        if word.load(Ordering::Relaxed) & bit == 0 {
            self.cold.check_in_place(self.layer, self.head, group, physical, bytes)?;
            word.fetch_or(bit, Ordering::Relaxed);
        }
        Ok(Some(bytes))
    }
}

/// Unneeded groups read anyway to join two needed ones into one request: an SSD serves a few
/// more sequential pages faster than one more random read (on the disk here, random 4 KiB
/// reads reach a quarter to a third of the sequential rate). Groups read in place join nothing.
const MAX_BRIDGED_GROUPS: usize = 2;

/// Which of one layer's groups a read takes, per head, and how: in place those of lanes read
/// through the page cache that were read through it since last written, the rest copied, small
/// gaps between those bridged.
#[derive(Debug, Default, Clone)]
pub(in crate::kv) struct ReadPlan {
    /// Per head: groups read in place (ascending), each with where it lies in the lane.
    in_place: Vec<Vec<(usize, usize)>>,
    /// Per head: groups copied (ascending), bridges included.
    copied: Vec<Vec<usize>>,
}

impl ReadPlan {
    /// Plans reading each head's `needed` groups (ascending) of `layer`.
    pub fn new(cold: &ColdPool, layer: usize, mut needed: Vec<Vec<usize>>) -> Self {
        let in_place = needed.iter_mut().enumerate().map(|(head, g)| cold.take_in_cache(layer, head, g)).collect();
        let copied = needed.iter().map(|g| bridged(g, MAX_BRIDGED_GROUPS)).collect();
        Self { in_place, copied }
    }

    pub fn is_empty(&self) -> bool {
        self.groups() == 0
    }

    /// Groups it reads, in place or copied.
    pub fn groups(&self) -> usize {
        self.in_place.iter().map(Vec::len).sum::<usize>() + self.copied.iter().map(Vec::len).sum::<usize>()
    }

    /// Bytes its copies take in a buffer.
    pub fn copied_bytes(&self, cold: &ColdPool) -> usize {
        self.copied_groups() * cold.layout().disk_group_bytes()
    }

    /// The plan cut to copies of at most `max_bytes`: each head keeps the same share of its
    /// copied groups, its first ones (groups read in place stage nothing and all stay).
    pub fn truncated(mut self, cold: &ColdPool, max_bytes: usize) -> Self {
        let (total, allowed) = (self.copied_groups(), max_bytes / cold.layout().disk_group_bytes());
        if total > allowed {
            for groups in &mut self.copied {
                groups.truncate(groups.len() * allowed / total);
            }
        }
        self
    }

    /// The plan as pieces whose copies take at most `max_bytes` each (at least one group), in
    /// head and group order; the groups read in place go with the first.
    pub fn into_pieces(self, cold: &ColdPool, max_bytes: usize) -> Vec<Self> {
        let per_piece = (max_bytes / cold.layout().disk_group_bytes()).max(1);
        let n_heads = self.copied.len();
        let mut pieces = vec![Self { in_place: self.in_place, copied: vec![Vec::new(); n_heads] }];
        let mut room = per_piece;
        for (head, groups) in self.copied.into_iter().enumerate() {
            let mut rest = &groups[..];
            while !rest.is_empty() {
                if room == 0 {
                    pieces.push(Self { in_place: vec![Vec::new(); n_heads], copied: vec![Vec::new(); n_heads] });
                    room = per_piece;
                }
                let (taken, left) = rest.split_at(room.min(rest.len()));
                pieces.last_mut().expect("one piece at least").copied[head].extend_from_slice(taken);
                (room, rest) = (room - taken.len(), left);
            }
        }
        pieces
    }

    fn copied_groups(&self) -> usize {
        self.copied.iter().map(Vec::len).sum()
    }

    /// Whether it reads `head`'s group `group`.
    pub fn covers(&self, head: usize, group: usize) -> bool {
        let copied = self.copied.get(head).is_some_and(|g| g.binary_search(&group).is_ok());
        copied || self.in_place.get(head).is_some_and(|g| g.binary_search_by_key(&group, |&(g, _)| g).is_ok())
    }
}

/// `groups` (ascending) with every gap of at most `max_gap` groups between two of them filled in.
fn bridged(groups: &[usize], max_gap: usize) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::with_capacity(groups.len());
    for &g in groups {
        if let Some(&last) = out.last() {
            if g - last - 1 <= max_gap {
                out.extend(last + 1..g);
            }
        }
        out.push(g);
    }
    out
}

/// Reads what `plan` says of `layer`: counts the groups it reads in place, and copies the rest
/// into `buf` (grown if too small), head after head, as the pool keeps them: one request per run
/// of consecutive groups, many in flight at once (an SSD needs a deep queue for its random-read
/// rate): through this thread's io_uring, or where there is none from the I/O threads.
pub(in crate::kv) fn read_heads(cold: &ColdPool, layer: usize, plan: ReadPlan, buf: &mut AlignedBuf) -> Result<Staged> {
    let parts = read_parts(plan.groups() * cold.layout().disk_group_bytes());
    read_heads_in_parts(cold, layer, plan, buf, parts)
}

/// [`read_heads`], its requests shared by `parts` I/O threads.
fn read_heads_in_parts(
    cold: &ColdPool,
    layer: usize,
    plan: ReadPlan,
    buf: &mut AlignedBuf,
    parts: usize,
) -> Result<Staged> {
    use rayon::prelude::*;
    let ReadPlan { in_place, copied: groups } = plan;
    in_place.iter().enumerate().try_for_each(|(head, in_place)| cold.read_in_place(layer, head, in_place))?;
    let gb = cold.layout().disk_group_bytes();
    let total: usize = groups.iter().map(Vec::len).sum();
    if buf.len() < total * gb {
        *buf = AlignedBuf::zeroed(total * gb);
    }
    let mut staged = Staged { layer, heads: Vec::with_capacity(groups.len()) };
    let mut offset = 0;
    for (g, in_place) in groups.into_iter().zip(in_place) {
        let n = g.len();
        staged.heads.push(StagedHead { groups: g, offset, in_place });
        offset += n * gb;
    }
    if total == 0 {
        return Ok(staged); // nothing to copy: no hand-off to the I/O threads
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
    use crate::kv::cold::format::ColdType;
    use crate::kv::cold::ColdLayout;
    use crate::kv::fault::{self, ColdFaults, FailingRead};
    use std::os::unix::fs::FileExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A scratch directory on the disk, not /tmp (which may be tmpfs, where nothing is direct).
    fn on_disk(name: &str) -> tempfile::TempDir {
        let parent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-scratch");
        std::fs::create_dir_all(&parent).unwrap();
        tempfile::Builder::new().prefix(&format!("hillside-{name}-")).tempdir_in(parent).unwrap()
    }

    #[test]
    fn a_plan_cut_to_a_cap_or_into_pieces_stages_no_more_than_it_is_allowed() {
        let scratch = on_disk("pieces");
        let cold = ColdPool::create(scratch.path(), ColdLayout::f16(1, 2, 64, 64)).unwrap();
        let gb = cold.layout().disk_group_bytes();
        let groups = vec![(0..10).collect::<Vec<_>>(), vec![3, 4, 20]];
        let plan = || ReadPlan::new(&cold, 0, groups.clone());
        assert_eq!(
            (plan().copied, plan().copied_bytes(&cold)),
            (groups.clone(), 13 * gb),
            "nothing cached: all copied"
        );

        let pieces = plan().into_pieces(&cold, 4 * gb);
        assert!(pieces.iter().all(|p| p.copied_bytes(&cold) <= 4 * gb), "{pieces:?}");
        for (head, want) in groups.iter().enumerate() {
            let read: Vec<usize> = pieces.iter().flat_map(|p| p.copied[head].clone()).collect();
            assert_eq!(&read, want, "every group of head {head} once, in order");
        }
        assert_eq!(pieces.len(), 4, "13 groups in pieces of 4");
        assert_eq!(plan().into_pieces(&cold, 1).len(), 13, "a piece takes a group at least");

        let cut = plan().truncated(&cold, 6 * gb);
        assert_eq!(cut.copied, vec![(0..4).collect::<Vec<_>>(), vec![3]], "each head its share, its first groups");
        assert_eq!(plan().truncated(&cold, 13 * gb).copied, groups, "a plan under the cap stays whole");
    }

    /// What a plan of `groups` (per head) of `layer` reads in place, per head.
    fn in_place(cold: &ColdPool, layer: usize, groups: &[Vec<usize>]) -> Vec<Vec<usize>> {
        let plan = ReadPlan::new(cold, layer, groups.to_vec());
        plan.in_place.iter().map(|g| g.iter().map(|&(g, _)| g).collect()).collect()
    }

    #[test]
    fn groups_read_through_the_page_cache_are_then_read_in_place_until_rewritten() {
        // Layer 1 of three KV heads dealt across two files: heads 0 and 2 in the first.
        const LAYER: usize = 1;
        for cold_type in [ColdType::F16, ColdType::Q8] {
            let scratch = [on_disk("in-place-a"), on_disk("in-place-b")];
            let layout = ColdLayout { cold_type, ..ColdLayout::f16(2, 3, 64, 40) };
            let cold = ColdPool::create_in(&scratch.each_ref().map(|d| d.path().to_path_buf()), layout, 0).unwrap();
            let write = |head: usize, group: usize, seed: usize| {
                let mut page = cold.buffer(1);
                let words = page.as_u16_mut();
                words.iter_mut().enumerate().for_each(|(i, w)| {
                    *w = half::f16::from_f32(((i * 31 + group * 7 + head * 3 + seed) % 200) as f32 / 100.0).to_bits()
                });
                cold.write_group(LAYER, head, group, &page).unwrap();
            };
            (0..3).for_each(|head| (0..40).for_each(|group| write(head, group, 0)));
            let groups = vec![vec![0, 1, 2, 3, 4, 9], vec![5, 6, 30], vec![7, 8]];
            let read = |want_in_place: &[&[usize]]| {
                let got = in_place(&cold, LAYER, &groups);
                assert_eq!(got, want_in_place, "{cold_type:?}: groups read in place");
                let mut buf = AlignedBuf::zeroed(0);
                let staged = read_heads(&cold, LAYER, ReadPlan::new(&cold, LAYER, groups.clone()), &mut buf).unwrap();
                let mut check = AlignedBuf::zeroed(layout.disk_group_bytes());
                for (head, g) in groups.iter().enumerate().flat_map(|(h, g)| g.iter().map(move |&g| (h, g))) {
                    // The same bytes as a read of that one group.
                    let mut run = vec![GroupRun {
                        head,
                        first: g,
                        count: 1,
                        dst: check.as_bytes_mut(),
                        staging: Staging::AsKept,
                    }];
                    read_all(&cold, LAYER, &mut run).unwrap();
                    let want = &check.as_bytes()[..layout.disk_group_bytes()];
                    assert_eq!(
                        staged.group(&cold, &buf, head, g).unwrap(),
                        Some(want),
                        "{cold_type:?}: head {head} group {g}"
                    );
                }
            };
            // Written directly, nothing is in the page cache: the pool reads through it, and
            // from then on in place.
            read(&[&[], &[], &[]]);
            cold.set_cached_lanes(6);
            read(&[&[], &[], &[]]);
            let requests = cold.stats.reads.load(Ordering::Relaxed);
            read(&[&[0, 1, 2, 3, 4, 9], &[5, 6, 30], &[7, 8]]);
            assert_eq!(
                cold.stats.reads.load(Ordering::Relaxed) - requests,
                groups.iter().map(Vec::len).sum::<usize>() as u64,
                "{cold_type:?}: only the checking reads of one group each made requests"
            );
            // A rewritten group is read through the page cache again, and so are the neighbours
            // that share one of its pages: q8 groups take five eighths of a page.
            write(0, 2, 1);
            let next_to_2: &[usize] = if cold_type == ColdType::Q8 { &[0, 4, 9] } else { &[0, 1, 3, 4, 9] };
            read(&[next_to_2, &[5, 6, 30], &[7, 8]]);
            read(&[&[0, 1, 2, 3, 4, 9], &[5, 6, 30], &[7, 8]]);
            // Lanes the page cache no longer holds are read directly again (layer 1's first
            // lane is the pool's fourth).
            cold.set_cached_lanes(4);
            read(&[&[0, 1, 2, 3, 4, 9], &[], &[]]);
        }
    }

    #[test]
    fn a_group_damaged_on_the_disk_fails_when_it_is_read_in_place() {
        let scratch = on_disk("in-place-damage");
        let layout = ColdLayout::f16(1, 1, 64, 40);
        let cold = ColdPool::create(scratch.path(), layout).unwrap();
        let page = cold.buffer(1);
        (0..40).for_each(|g| cold.write_group(0, 0, g, &page).unwrap());
        cold.set_cached_lanes(1);
        let mut buf = AlignedBuf::zeroed(0);
        let mut read = || read_heads(&cold, 0, ReadPlan::new(&cold, 0, vec![vec![3, 7]]), &mut buf).unwrap();
        read();
        read();
        assert_eq!(in_place(&cold, 0, &[vec![3, 7]]), [[3, 7]]);
        // A byte of group 7 flips on the disk, behind the pool's back (a direct write, which the
        // page cache then reads back).
        let mut damaged = cold.buffer(1);
        damaged.as_bytes_mut()[100] ^= 0x5a;
        let file = &cold.files[0];
        file.file.write_all_at(damaged.as_bytes(), cold.file_offset(0, 0, 7)).unwrap();
        // The read takes both in place; group 3 still reads, and group 7 fails when it is asked
        // for, each time, by either lookup.
        let staged = read();
        let pages = staged.head_pages(&cold, &buf, 0);
        assert_eq!(pages.get(3).unwrap(), Some(page.as_bytes()));
        assert_eq!(staged.group(&cold, &buf, 0, 3).unwrap(), Some(page.as_bytes()));
        for error in
            [pages.get(7).unwrap_err(), pages.get(7).unwrap_err(), staged.group(&cold, &buf, 0, 7).unwrap_err()]
        {
            assert!(
                matches!(error, crate::error::Error::ColdBlockDamaged { head: 0, ref tokens, .. } if tokens.start == 7 * 16),
                "{error}"
            );
        }
    }

    #[test]
    fn small_gaps_are_bridged_and_large_ones_kept() {
        assert_eq!(bridged(&[0, 2, 5, 9, 10], 2), vec![0, 1, 2, 3, 4, 5, 9, 10]);
        assert_eq!(bridged(&[3, 7], 2), vec![3, 7]);
        assert_eq!(bridged(&[62, 65, 130, 191, 192], 2), vec![62, 63, 64, 65, 130, 191, 192]);
        assert_eq!(bridged(&[], 2), Vec::<usize>::new());
    }

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
            let staged =
                read_heads_in_parts(&cold, 1, ReadPlan::new(&cold, 1, groups.clone()), &mut buf, parts).unwrap();
            let bytes: Vec<Vec<u8>> = (0..3)
                .flat_map(|h| (0..40).map(move |g| (h, g)))
                .filter_map(|(h, g)| staged.group(&cold, &buf, h, g).unwrap().map(<[u8]>::to_vec))
                .collect();
            // The 16 asked for, and the gaps of two groups or less between them.
            assert_eq!(bytes.len(), 22, "{parts} parts: every group asked for is staged, gaps bridged");
            bytes
        };
        let whole = staged_bytes(1);
        assert_eq!(u16::from_le_bytes([whole[0][2], whole[0][3]]), 10_001, "layer 1, head 0, group 0, word 1");
        for parts in [2, 3, 4] {
            assert_eq!(staged_bytes(parts), whole, "{parts} parts");
        }
        // A failure in any part fails the read, with the pool's error.
        plan.failing_read.as_ref().unwrap().times.store(1, Ordering::Relaxed);
        let plan = || ReadPlan::new(&cold, 1, groups.clone());
        let error = read_heads_in_parts(&cold, 1, plan(), &mut AlignedBuf::zeroed(0), 3).unwrap_err();
        assert!(error.to_string().contains("read failed"), "{error}");
        assert!(read_heads_in_parts(&cold, 1, plan(), &mut AlignedBuf::zeroed(0), 3).is_ok(), "the fault was used up");
        fault::clear(&dir);
        drop(cold);
    }
}
