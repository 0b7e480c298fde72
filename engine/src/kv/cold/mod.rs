//! The cold pool: one preallocated file per sequence on the SSD (or one on each of several
//! SSDs, the KV heads dealt across them), holding K and V in page-sized groups of
//! [`GROUP_TOKENS`] tokens, laid out by (layer, KV head, group) so that one head's groups are
//! contiguous and a whole-head read is one large sequential request. Which token
//! sits in which slot of a head's groups is the placement's business ([`placement`]):
//! the pool reads and writes whole groups. It keeps them as f16 or in 8 bits
//! ([`format`]): callers write f16 rows, and read them back as f16 rows or, to
//! stage fewer bytes, as the file keeps them ([`Staging::AsKept`]), decoding the rows they use.
//!
//! A head's groups come in blocks of [`BLOCK_GROUPS`], and each head's region has one spare
//! block: [`ColdPool::relocate_block`] writes a block's new contents into the spare and only
//! then makes it the block, so a rewrite that fails midway leaves the old block whole and in use.
//!
//! Writes use direct I/O (O_DIRECT, page-aligned buffers). Reads take one of two paths
//! (DUAL-BLADE): the first [`ColdPool::cached_lanes`] (layer, KV head) regions are read through
//! the page cache, which is free speed while the machine has memory to spare, and the rest with
//! direct I/O, so that under memory pressure the cache neither competes with the hot pool nor
//! hides the device's real cost; the owner sets the split from measured headroom
//! ([`crate::headroom`]). Direct writes invalidate the cached pages they overwrite, so both
//! paths read what was last written. Through the page cache, a group read once is read in place
//! after that, through a mapping of the file ([`mapped`]), until it is written again. Where the
//! filesystem refuses O_DIRECT (tmpfs, some network filesystems) the pool falls back to buffered
//! I/O and says so in the log. Every group carries a CRC32 (kept in DRAM), so a damaged block is
//! an error, never garbage attention. The file is removed when the pool is dropped; files left
//! by a crashed process are swept the next time a pool is created in that directory.
//!
//! For a SmartSSD the file also holds, after the K/V groups, each layer's scoring keys in chunks
//! laid out for the FPGA kernel ([`crate::score::contract::KeyChunkLayout`]), read with direct I/O
//! straight into the card's peer-to-peer buffers. They carry no checksum: the host never sees
//! those bytes, and a damaged one can only misrank a token, never corrupt attention.

pub mod format;
mod mapped;
pub mod placement;
pub mod staged;
mod uring;

use crate::aligned::{AlignedBuf, IO_ALIGN};
use crate::error::{Error, Result};
use crate::kv::fault::{self, PoolFaults};
use crate::score::contract::{KeyChunkFile, CHUNK_TOKENS};
use format::{decode_q8, encode_q8, ColdType};
use mapped::MappedFile;
use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Tokens per cold-pool group (one page of K and V for a 64-dim head).
pub const GROUP_TOKENS: usize = 16;
/// Groups per block, the unit [`ColdPool::relocate_block`] rewrites.
pub const BLOCK_GROUPS: usize = 16;
const FILE_PREFIX: &str = "hillside-kv-";
const FILE_SUFFIX: &str = ".cold";

/// Where each group lives in the file, and how it is kept there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColdLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub max_groups: usize,
    pub cold_type: ColdType,
}

impl ColdLayout {
    /// A layout of f16 groups.
    pub fn f16(n_layers: usize, n_kv_heads: usize, head_dim: usize, max_groups: usize) -> Self {
        Self { n_layers, n_kv_heads, head_dim, max_groups, cold_type: ColdType::F16 }
    }

    /// f16 values of K (or of V) in one group.
    pub fn group_values(&self) -> usize {
        GROUP_TOKENS * self.head_dim
    }

    /// Bytes of a group as readers and writers see it: K then V in f16, padded to whole pages.
    pub fn group_bytes(&self) -> usize {
        (2 * self.group_values() * 2).div_ceil(IO_ALIGN) * IO_ALIGN
    }

    /// Bytes one layer takes, every head's groups.
    pub fn layer_bytes(&self) -> usize {
        self.n_kv_heads * self.max_groups * self.disk_group_bytes()
    }

    /// Bytes a group occupies in the file, as its [`ColdType`] keeps it.
    pub fn disk_group_bytes(&self) -> usize {
        self.cold_type.disk_bytes(2 * self.group_values(), self.head_dim)
    }

    /// Bytes a read leaves per group in its buffer.
    pub fn staged_group_bytes(&self, staging: Staging) -> usize {
        match staging {
            Staging::F16 => self.group_bytes(),
            Staging::AsKept => self.disk_group_bytes(),
        }
    }

    /// Blocks of a (layer, KV head) that hold its groups, the spare not counted.
    pub fn lane_blocks(&self) -> usize {
        self.max_groups.div_ceil(BLOCK_GROUPS)
    }

    /// Groups each (layer, KV head) region has in the file: its blocks and the spare.
    pub fn lane_groups(&self) -> usize {
        (self.lane_blocks() + 1) * BLOCK_GROUPS
    }

    /// Where the file holds group `physical_group` of (layer, head)'s region, in groups.
    pub fn group_index(&self, layer: usize, head: usize, physical_group: usize) -> usize {
        (layer * self.n_kv_heads + head) * self.lane_groups() + physical_group
    }

    pub fn file_bytes(&self) -> u64 {
        (self.n_layers * self.n_kv_heads * self.lane_groups() * self.disk_group_bytes()) as u64
    }
}

/// I/O counters, for the benchmark and the stats route.
#[derive(Debug, Default)]
pub struct ColdIoStats {
    pub bytes_read: AtomicU64,
    /// The part of `bytes_read` read through the page cache.
    pub bytes_read_cached: AtomicU64,
    pub bytes_written: AtomicU64,
    pub reads: AtomicU64,
}

/// Marks a checksum slot as written (a CRC32 of 0 is a valid checksum).
const WRITTEN: u64 = 1 << 32;

/// One of the pool's files: the lanes of the KV heads its directory holds.
struct PoolFile {
    /// Direct I/O where the filesystem allows it.
    file: File,
    /// The same file opened for buffered reads, through the page cache.
    cached: File,
    /// Its K/V groups mapped for reading in place what the page cache holds; `None` where the
    /// mapping failed (then every read copies).
    mapping: Option<MappedFile>,
    path: PathBuf,
    /// Bytes of K/V groups read from this file (a share of [`ColdIoStats::bytes_read`]).
    bytes_read: AtomicU64,
}

pub struct ColdPool {
    /// One per directory (one per SSD): KV head `h` lives in `files[h % files.len()]`, so
    /// each device serves its share of every read. The first also holds the key section.
    files: Vec<PoolFile>,
    /// Lanes (`layer * n_kv_heads + head`) below this are read through the page cache.
    cached_lanes: AtomicUsize,
    layout: ColdLayout,
    /// Bytes of one layer's scoring-key chunk; 0 when the file has no key section.
    key_chunk_bytes: usize,
    /// CRC32 of each written group (by its place in the file) with [`WRITTEN`] set; 0 until
    /// written. Atomic, so the pool can be shared with readers that work ahead (prefetch)
    /// while the owner writes.
    checksums: Vec<AtomicU64>,
    /// `[lane][block]`: which of the lane's physical blocks holds each block (at first the
    /// same one). Atomic for the same readers; only the owner relocates.
    blocks: Vec<AtomicU32>,
    /// `[lane]`: the physical block that holds none.
    spare: Vec<AtomicU32>,
    /// Groups (by their place in the file) read through the page cache since they were last
    /// written, so read in place from now on (see [`ColdPool::take_in_cache`]).
    in_cache: GroupBits,
    pub stats: ColdIoStats,
    /// Injected by tests ([`crate::kv::fault`]); `None` otherwise.
    faults: Option<PoolFaults>,
}

/// A bit per group of the pool, shared by its readers.
struct GroupBits(Vec<AtomicU64>);

impl GroupBits {
    fn new(groups: usize) -> Self {
        Self((0..groups.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    fn get(&self, i: usize) -> bool {
        self.0[i / 64].load(Ordering::Relaxed) >> (i % 64) & 1 == 1
    }

    fn set(&self, i: usize) {
        self.0[i / 64].fetch_or(1 << (i % 64), Ordering::Relaxed);
    }

    fn clear(&self, i: usize) {
        self.0[i / 64].fetch_and(!(1 << (i % 64)), Ordering::Relaxed);
    }
}

/// The error of an I/O call on the pool's file: its path goes to the log, not into the error.
fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    tracing::error!(path = %path.display(), error = %e, "cold pool: {what}");
    Error::ColdIo { what: what.to_string(), source: e }
}

/// Directories already swept by this process.
static SWEPT: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

impl PoolFile {
    /// Creates the file in `dir` (created if missing), for direct I/O at `alignment` (bytes,
    /// in the file and in memory) and for cached I/O.
    fn create(dir: &Path, alignment: usize) -> Result<Self> {
        crate::private_files::create_dir(dir).map_err(|e| io_error("cannot create its directory", dir, e))?;
        sweep_once(dir);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("{FILE_PREFIX}{}-{}{FILE_SUFFIX}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let path = dir.join(name);
        let file = open_pool_file(&path, alignment)?;
        match File::open(&path) {
            Ok(cached) => Ok(Self { file, cached, mapping: None, path, bytes_read: AtomicU64::new(0) }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(io_error("cannot open its file for cached reads", &path, e))
            }
        }
    }

    /// Reserves `len` bytes of the file now, so a full disk is reported here rather than
    /// mid-decode.
    fn preallocate(&self, len: u64) -> Result<()> {
        // SAFETY: plain syscall on an owned, open descriptor.
        let rc = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&self.file), 0, len as libc::off_t) };
        match rc {
            0 => Ok(()),
            libc::EOPNOTSUPP | libc::EINVAL => {
                self.file.set_len(len).map_err(|e| io_error("cannot size its file", &self.path, e))
            }
            errno => Err(io_error(
                &format!("cannot reserve {} MB", len / 1_000_000),
                &self.path,
                std::io::Error::from_raw_os_error(errno),
            )),
        }
    }
}

impl Drop for PoolFile {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "could not remove cold pool file");
        }
    }
}

impl ColdPool {
    /// Creates and preallocates the pool file in `dir` (created if missing).
    pub fn create(dir: &Path, layout: ColdLayout) -> Result<Self> {
        Self::create_in(&[dir.to_path_buf()], layout, 0)
    }

    /// Creates and preallocates one pool file in each of `dirs` (created if missing; one per
    /// SSD), the KV heads dealt across them, with room in the first for every layer's scoring
    /// keys in chunks of `key_chunk_bytes` (a whole number of pages) per [`CHUNK_TOKENS`]
    /// tokens (0 for none).
    pub fn create_in(dirs: &[PathBuf], layout: ColdLayout, key_chunk_bytes: usize) -> Result<Self> {
        assert!(key_chunk_bytes.is_multiple_of(IO_ALIGN));
        assert!(!dirs.is_empty(), "a cold pool needs a directory");
        if dirs.len() > layout.n_kv_heads {
            tracing::warn!(
                dirs = dirs.len(),
                kv_heads = layout.n_kv_heads,
                "more cold-pool directories than KV heads: the extra ones stay unused"
            );
        }
        // A file that exists is removed when `files` (or the pool) is dropped on an error path.
        let alignment = layout.cold_type.alignment();
        let files = dirs
            .iter()
            .take(layout.n_kv_heads)
            .map(|dir| PoolFile::create(dir, alignment))
            .collect::<Result<Vec<_>>>()?;
        let mut pool = Self {
            files,
            cached_lanes: AtomicUsize::new(0),
            layout,
            key_chunk_bytes,
            checksums: (0..layout.n_layers * layout.n_kv_heads * layout.lane_groups())
                .map(|_| AtomicU64::new(0))
                .collect(),
            blocks: (0..layout.n_layers * layout.n_kv_heads)
                .flat_map(|_| (0..layout.lane_blocks() as u32).map(AtomicU32::new))
                .collect(),
            spare: (0..layout.n_layers * layout.n_kv_heads)
                .map(|_| AtomicU32::new(layout.lane_blocks() as u32))
                .collect(),
            in_cache: GroupBits::new(layout.n_layers * layout.n_kv_heads * layout.lane_groups()),
            stats: ColdIoStats::default(),
            faults: fault::for_new_pool(&dirs[0]),
        };
        let keys = (pool.layout.n_layers * pool.max_key_chunks() * pool.key_chunk_bytes) as u64;
        for device in 0..pool.files.len() {
            let group_bytes = pool.device_group_bytes(device);
            let file = &mut pool.files[device];
            file.preallocate(group_bytes + if device == 0 { keys } else { 0 })?;
            file.mapping = MappedFile::map(&file.cached, group_bytes as usize)
                .inspect_err(|e| tracing::warn!(path = %file.path.display(), error = %e, "cold pool: cannot map its file; every read copies"))
                .ok();
        }
        Ok(pool)
    }

    pub fn layout(&self) -> ColdLayout {
        self.layout
    }

    /// The first file's path (the only one, with one directory).
    pub fn path(&self) -> &Path {
        &self.files[0].path
    }

    /// Bytes of K/V groups read from each directory's file, in the order of the directories.
    pub fn bytes_read_per_dir(&self) -> Vec<u64> {
        self.files.iter().map(|f| f.bytes_read.load(Ordering::Relaxed)).collect()
    }

    /// Which file holds KV head `head`, and that head's index among the file's heads.
    fn device(&self, head: usize) -> (usize, usize) {
        (head % self.files.len(), head / self.files.len())
    }

    /// KV heads file `device` holds.
    fn device_heads(&self, device: usize) -> usize {
        (self.layout.n_kv_heads - device).div_ceil(self.files.len())
    }

    /// Bytes of K/V groups in file `device`.
    fn device_group_bytes(&self, device: usize) -> u64 {
        (self.layout.n_layers * self.device_heads(device) * self.layout.lane_groups() * self.layout.disk_group_bytes())
            as u64
    }

    fn key_section_offset(&self) -> u64 {
        self.device_group_bytes(0)
    }

    fn max_key_chunks(&self) -> usize {
        (self.layout.max_groups * GROUP_TOKENS).div_ceil(CHUNK_TOKENS)
    }

    fn key_chunk_offset(&self, layer: usize, chunk: usize) -> u64 {
        assert!(
            self.key_chunk_bytes > 0 && layer < self.layout.n_layers && chunk < self.max_key_chunks(),
            "no such key chunk"
        );
        self.key_section_offset() + ((layer * self.max_key_chunks() + chunk) * self.key_chunk_bytes) as u64
    }

    /// The pool's section of scoring-key chunks, the only part of the file a SmartSSD's
    /// evaluator touches.
    pub fn key_chunks(self: &Arc<Self>) -> KeyChunkSection {
        KeyChunkSection(Arc::clone(self))
    }

    /// Writes one layer's scoring-key chunk (`key_chunk_bytes` from the start of `buf`).
    fn write_key_chunk(&self, layer: usize, chunk: usize, buf: &AlignedBuf) -> Result<()> {
        let bytes = &buf.as_bytes()[..self.key_chunk_bytes];
        let file = &self.files[0];
        file.file
            .write_all_at(bytes, self.key_chunk_offset(layer, chunk))
            .map_err(|e| io_error("write failed", &file.path, e))?;
        self.stats.bytes_written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Reads `dst.len()` bytes from `offset` into one layer's key chunk, into `dst`: a
    /// page-aligned buffer, normally a card's peer-to-peer mapping, so the bytes go from the SSD
    /// to the FPGA without passing through DRAM. Not counted as cold bytes read by the host.
    fn read_key_chunk(&self, layer: usize, chunk: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        assert!(offset + dst.len() <= self.key_chunk_bytes, "read past the key chunk");
        assert_eq!(dst.as_ptr() as usize % IO_ALIGN, 0, "direct I/O needs page-aligned buffers");
        let at = self.key_chunk_offset(layer, chunk) + offset as u64;
        let file = &self.files[0];
        file.file.read_exact_at(dst, at).map_err(|e| io_error("read failed", &file.path, e))
    }

    /// How many leading (layer, KV head) regions are read through the page cache.
    pub fn cached_lanes(&self) -> usize {
        self.cached_lanes.load(Ordering::Relaxed)
    }

    /// Reads of the first `lanes` (layer, KV head) regions go through the page cache from now
    /// on, the rest with direct I/O.
    pub fn set_cached_lanes(&self, lanes: usize) {
        self.cached_lanes.store(lanes, Ordering::Relaxed);
    }

    /// Where in (layer, head)'s region group `group` lies now, in groups.
    fn physical_group(&self, layer: usize, head: usize, group: usize) -> usize {
        let lane = layer * self.layout.n_kv_heads + head;
        let block =
            self.blocks[lane * self.layout.lane_blocks() + group / BLOCK_GROUPS].load(Ordering::Acquire) as usize;
        block * BLOCK_GROUPS + group % BLOCK_GROUPS
    }

    /// The offset of (layer, head)'s group `group` in its head's file, and its checksum's index.
    fn locate(&self, layer: usize, head: usize, group: usize) -> (u64, usize) {
        let physical = self.physical_group(layer, head, group);
        (self.file_offset(layer, head, physical), self.layout.group_index(layer, head, physical))
    }

    /// Where (layer, head)'s region holds `physical_group` in its head's file: lanes of the
    /// file's heads one after another, as [`ColdLayout::group_index`] lays out all of them.
    fn file_offset(&self, layer: usize, head: usize, physical_group: usize) -> u64 {
        let (device, local_head) = self.device(head);
        let lane = layer * self.device_heads(device) + local_head;
        ((lane * self.layout.lane_groups() + physical_group) * self.layout.disk_group_bytes()) as u64
    }

    /// The file KV head `head` lives in.
    fn file_of(&self, head: usize) -> &PoolFile {
        &self.files[self.device(head).0]
    }

    /// A buffer sized for `groups` consecutive groups.
    pub fn buffer(&self, groups: usize) -> AlignedBuf {
        AlignedBuf::zeroed(groups * self.layout.group_bytes())
    }

    /// Writes one group from `buf`, which holds K (token-major, `GROUP_TOKENS × head_dim` f16)
    /// followed by V, as laid out by [`ColdPool::buffer`].
    pub fn write_group(&self, layer: usize, head: usize, group: usize, buf: &AlignedBuf) -> Result<()> {
        self.write_groups(layer, head, group, 1, buf.as_bytes())
    }

    /// Writes groups `first .. first + count` of one (layer, head) from the start of `src`
    /// (page-aligned, groups laid out as [`ColdPool::buffer`]'s), one request per stretch of
    /// them that lies together in the file. On an error the groups before the failing one may
    /// be written; the caller treats none as written.
    pub fn write_groups(&self, layer: usize, head: usize, first: usize, count: usize, src: &[u8]) -> Result<()> {
        let (gb, dgb) = (self.layout.group_bytes(), self.layout.disk_group_bytes());
        assert!(first + count <= self.layout.max_groups && src.len() >= count * gb);
        assert_eq!(src.as_ptr() as usize % IO_ALIGN, 0, "direct I/O needs page-aligned buffers");
        // An injected fault fails the run at that group, after writing the groups before it.
        let failing =
            self.faults.as_ref().and_then(|f| (0..count).find_map(|i| f.on_write(layer, first + i).map(|e| (i, e))));
        let whole = failing.as_ref().map_or(count, |(i, _)| *i);
        let mut encoded = None;
        let disk = self.on_disk(&src[..whole * gb], &mut encoded);
        for (offset, index, groups) in self.stretches(layer, head, first, whole) {
            let bytes = &disk[groups.start * dgb..groups.end * dgb];
            let file = self.file_of(head);
            self.forget_cached(layer, head, index - self.layout.group_index(layer, head, 0), groups.len());
            file.file.write_all_at(bytes, offset).map_err(|e| io_error("write failed", &file.path, e))?;
            for (j, group) in bytes.chunks_exact(dgb).enumerate() {
                self.checksums[index + j].store(WRITTEN | u64::from(crc32fast::hash(group)), Ordering::Release);
            }
            self.stats.bytes_written.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        failing.map_or(Ok(()), |(_, e)| Err(io_error("write failed", &self.file_of(head).path, e)))
    }

    /// Replaces block `block` of (layer, head) (groups `block · BLOCK_GROUPS ..`) with the
    /// [`BLOCK_GROUPS`] groups at the start of `src`: they are written to the region's spare
    /// block, which then becomes the block, and the old one the spare. On an error the block
    /// is as it was. Readers that work ahead must not read the block meanwhile (their reads
    /// may see either copy).
    pub fn relocate_block(&self, layer: usize, head: usize, block: usize, src: &[u8]) -> Result<()> {
        let (gb, dgb) = (self.layout.group_bytes(), self.layout.disk_group_bytes());
        assert!(block < self.layout.lane_blocks() && src.len() >= BLOCK_GROUPS * gb);
        assert_eq!(src.as_ptr() as usize % IO_ALIGN, 0, "direct I/O needs page-aligned buffers");
        let lane = layer * self.layout.n_kv_heads + head;
        let spare = self.spare[lane].load(Ordering::Relaxed) as usize;
        let first = self.layout.group_index(layer, head, spare * BLOCK_GROUPS);
        // An injected fault fails the block at that group, after writing the groups before it.
        let failing = self
            .faults
            .as_ref()
            .and_then(|f| (0..BLOCK_GROUPS).find_map(|i| f.on_write(layer, block * BLOCK_GROUPS + i).map(|e| (i, e))));
        let whole = failing.as_ref().map_or(BLOCK_GROUPS, |(i, _)| *i);
        let file = self.file_of(head);
        let mut encoded = None;
        let disk = self.on_disk(&src[..BLOCK_GROUPS * gb], &mut encoded);
        self.forget_cached(layer, head, spare * BLOCK_GROUPS, BLOCK_GROUPS);
        let written = file.file.write_all_at(&disk[..whole * dgb], self.file_offset(layer, head, spare * BLOCK_GROUPS));
        written.and(failing.map_or(Ok(()), |(_, e)| Err(e))).map_err(|e| io_error("write failed", &file.path, e))?;
        for (i, group) in disk.chunks_exact(dgb).enumerate() {
            self.checksums[first + i].store(WRITTEN | u64::from(crc32fast::hash(group)), Ordering::Release);
        }
        self.stats.bytes_written.fetch_add((BLOCK_GROUPS * dgb) as u64, Ordering::Relaxed);
        let old = self.blocks[lane * self.layout.lane_blocks() + block].swap(spare as u32, Ordering::AcqRel);
        self.spare[lane].store(old, Ordering::Relaxed);
        Ok(())
    }

    /// Whole groups (f16, page-aligned, as [`ColdPool::buffer`] lays them out) as the file keeps
    /// them: the same bytes for f16, encoded into `encoded` for q8.
    fn on_disk<'a>(&self, groups: &'a [u8], encoded: &'a mut Option<AlignedBuf>) -> &'a [u8] {
        let (gb, dgb) = (self.layout.group_bytes(), self.layout.disk_group_bytes());
        match self.layout.cold_type {
            ColdType::F16 => groups,
            ColdType::Q8 => {
                let count = groups.len() / gb;
                let disk = encoded.insert(AlignedBuf::zeroed(count * dgb));
                for (group, out) in groups.chunks_exact(gb).zip(disk.as_bytes_mut().chunks_exact_mut(dgb)) {
                    encode_q8(&f16_words(group)[..2 * self.layout.group_values()], self.layout.head_dim, out);
                }
                &disk.as_bytes()[..count * dgb]
            }
        }
    }

    /// Reads groups `first .. first + count` of one (layer, head) into the start of `dst` as f16
    /// rows, with one request, checking each group's checksum. `dst` must start on a page
    /// boundary (a page-aligned slice of an [`AlignedBuf`]).
    pub fn read_groups(&self, layer: usize, head: usize, first: usize, count: usize, dst: &mut [u8]) -> Result<()> {
        self.read_run(layer, &mut GroupRun { head, first, count, dst, staging: Staging::F16 })
    }

    /// Reads one run of groups of `layer` as it asks to be staged, checking each group's
    /// checksum.
    pub fn read_run(&self, layer: usize, run: &mut GroupRun<'_>) -> Result<()> {
        let (file, pieces) = self.plan_read(layer, run);
        for (offset, bytes) in pieces {
            file.read_exact_at(&mut run.dst[bytes], offset)
                .map_err(|e| io_error("read failed", &self.file_of(run.head).path, e))?;
        }
        self.finish_read(layer, run)
    }

    /// Reads every run of groups of `layer`, each staged as it asks, with all of their requests
    /// in flight at once from this thread (io_uring). `None` where this thread cannot use
    /// io_uring: nothing was read, and the caller reads another way
    /// ([`ColdPool::read_run`], one by one).
    pub fn read_runs(&self, layer: usize, runs: &mut [GroupRun<'_>]) -> Option<Result<()>> {
        use std::os::fd::AsRawFd;
        if !uring::available() {
            return None;
        }
        let mut pieces = Vec::new();
        for run in runs.iter_mut() {
            let (file, planned) = self.plan_read(layer, run);
            pieces.push((file.as_raw_fd(), self.file_of(run.head).path.as_path(), planned));
        }
        // A run's requests tile a stretch of its buffer in order: cut it into their slices.
        let (mut reads, mut paths) = (Vec::new(), Vec::new());
        for (run, (fd, path, planned)) in runs.iter_mut().zip(pieces) {
            let mut rest = &mut run.dst[planned.first().map_or(0, |(_, bytes)| bytes.start)..];
            for (offset, bytes) in planned {
                let (dst, tail) = std::mem::take(&mut rest).split_at_mut(bytes.len());
                reads.push(uring::ReadAt { fd, offset, dst });
                paths.push(path);
                rest = tail;
            }
        }
        match uring::read_all(&mut reads)? {
            Ok(()) => Some(runs.iter_mut().try_for_each(|run| self.finish_read(layer, run))),
            Err(failed) => Some(Err(io_error("read failed", paths[failed.request], failed.error))),
        }
    }

    /// Groups `first .. first + count` of (layer, head) cut where they stop lying one after
    /// another in the file (all of them together, unless blocks were relocated): each stretch's
    /// file offset, its first checksum index, and its groups counted from `first`.
    fn stretches(&self, layer: usize, head: usize, first: usize, count: usize) -> Vec<(u64, usize, Range<usize>)> {
        let mut stretches = Vec::new();
        let mut i = 0;
        while i < count {
            let (offset, index) = self.locate(layer, head, first + i);
            let mut len = 1;
            while i + len < count && self.locate(layer, head, first + i + len).1 == index + len {
                len += 1;
            }
            stretches.push((offset, index, i..i + len));
            i += len;
        }
        stretches
    }

    /// The file a run of groups is read from, and one request (file offset, bytes of the run's
    /// buffer) per stretch of its groups that lie one after another in the file: all of them,
    /// unless blocks were relocated. The requests fill [`ColdPool::encoded_range`] of the buffer.
    fn plan_read(&self, layer: usize, run: &mut GroupRun<'_>) -> (&File, Vec<(u64, Range<usize>)>) {
        let GroupRun { head, first, count, .. } = *run;
        let dgb = self.layout.disk_group_bytes();
        let at = self.encoded_range(run).start;
        assert!(
            first + count <= self.layout.max_groups
                && run.dst.len() >= count * self.layout.staged_group_bytes(run.staging)
        );
        assert_eq!(
            run.dst.as_ptr() as usize % self.layout.cold_type.alignment(),
            0,
            "direct I/O needs aligned buffers"
        );
        if let Some(faults) = &self.faults {
            faults.on_read(layer, head, first);
        }
        let cached = layer * self.layout.n_kv_heads + head < self.cached_lanes();
        let pieces: Vec<(u64, Range<usize>)> = self
            .stretches(layer, head, first, count)
            .into_iter()
            .map(|(offset, _, groups)| (offset, at + groups.start * dgb..at + groups.end * dgb))
            .collect();
        self.stats.reads.fetch_add(pieces.len() as u64, Ordering::Relaxed);
        let bytes = (count * dgb) as u64;
        self.stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        self.file_of(head).bytes_read.fetch_add(bytes, Ordering::Relaxed);
        if cached {
            self.stats.bytes_read_cached.fetch_add(bytes, Ordering::Relaxed);
        }
        let file = self.file_of(head);
        (if cached { &file.cached } else { &file.file }, pieces)
    }

    /// Where a run's groups are read into its buffer, as the file keeps them: the whole of its
    /// staged bytes, unless a q8 run is staged as f16: then their end, so that each group,
    /// decoded in order, lands before the bytes of the next ones.
    fn encoded_range(&self, run: &GroupRun<'_>) -> Range<usize> {
        let (staged, dgb) = (self.layout.staged_group_bytes(run.staging), self.layout.disk_group_bytes());
        run.count * (staged - dgb)..run.count * staged
    }

    /// Checks each group a run read against its checksum, then decodes it in place (a q8 run
    /// staged as f16).
    fn finish_read(&self, layer: usize, run: &mut GroupRun<'_>) -> Result<()> {
        if let Some(e) = self.faults.as_ref().and_then(|f| f.on_read_done(layer)) {
            return Err(io_error("read failed", &self.file_of(run.head).path, e));
        }
        self.check_read(layer, run)?;
        if self.layout.cold_type == ColdType::Q8 && run.staging == Staging::F16 {
            let (gb, dgb, values) =
                (self.layout.group_bytes(), self.layout.disk_group_bytes(), 2 * self.layout.group_values());
            let at = self.encoded_range(run).start;
            let mut group = vec![0u8; dgb];
            for i in 0..run.count {
                // Copied out first: the last groups' f16 rows overlap their own encoded bytes.
                group.copy_from_slice(&run.dst[at + i * dgb..][..dgb]);
                decode_q8(&group, self.layout.head_dim, &mut f16_words_mut(&mut run.dst[i * gb..][..gb])[..values]);
            }
        }
        Ok(())
    }

    /// Checks each group a run read against its checksum; those read through the page cache
    /// are read in place from now on.
    fn check_read(&self, layer: usize, run: &GroupRun<'_>) -> Result<()> {
        let dgb = self.layout.disk_group_bytes();
        let cached = layer * self.layout.n_kv_heads + run.head < self.cached_lanes();
        for (i, bytes) in run.dst[self.encoded_range(run)].chunks_exact(dgb).enumerate() {
            let group = run.first + i;
            let index = self.locate(layer, run.head, group).1;
            self.check_group(layer, run.head, group, index, bytes)?;
            if cached {
                self.in_cache.set(index);
            }
        }
        Ok(())
    }

    /// Checks (layer, head)'s group `group`, read as `bytes`, against the checksum at `index`.
    fn check_group(&self, layer: usize, head: usize, group: usize, index: usize, bytes: &[u8]) -> Result<()> {
        match self.checksums[index].load(Ordering::Acquire) {
            0 => Err(Error::Internal(format!(
                "cold pool: layer {layer} head {head} group {group} was read but never written"
            ))),
            sum if sum == WRITTEN | u64::from(crc32fast::hash(bytes)) => Ok(()),
            _ => {
                let tokens = group * GROUP_TOKENS..(group + 1) * GROUP_TOKENS;
                tracing::error!(path = %self.file_of(head).path.display(), layer, head, ?tokens, "cold pool block fails its checksum");
                Err(Error::ColdBlockDamaged { layer, head, tokens })
            }
        }
    }

    /// Takes out of `groups` (ascending) of (layer, head) those to read in place, and returns
    /// them as (group, where it lies in the lane): where the lane is read through the page
    /// cache, the groups read that way since they were last written. (Asking the kernel which
    /// pages it holds, with `mincore`, cost more than the copies it saved: it looks up each
    /// page of the lane that is not mapped yet.)
    pub(super) fn take_in_cache(&self, layer: usize, head: usize, groups: &mut Vec<usize>) -> Vec<(usize, usize)> {
        if self.file_of(head).mapping.is_none()
            || groups.is_empty()
            || layer * self.layout.n_kv_heads + head >= self.cached_lanes()
        {
            return Vec::new();
        }
        let mut in_place = Vec::new();
        groups.retain(|&group| {
            let physical = self.physical_group(layer, head, group);
            let index = self.layout.group_index(layer, head, physical);
            let cached = self.in_cache.get(index);
            if cached {
                in_place.push((group, physical));
            }
            !cached
        });
        in_place
    }

    /// A direct write of (layer, head)'s physical groups `first .. first + count` drops the
    /// pages they lie in from the page cache, with any neighbour that shares one (q8 groups
    /// are not whole pages): they are read through it again before they are read in place.
    fn forget_cached(&self, layer: usize, head: usize, first: usize, count: usize) {
        let dgb = self.layout.disk_group_bytes();
        let pages = first * dgb / IO_ALIGN..((first + count) * dgb).div_ceil(IO_ALIGN);
        let groups = pages.start * IO_ALIGN / dgb..(pages.end * IO_ALIGN).div_ceil(dgb).min(self.layout.lane_groups());
        let base = self.layout.group_index(layer, head, 0);
        for index in base + groups.start..base + groups.end {
            self.in_cache.clear(index);
        }
    }

    /// Reads the groups [`ColdPool::take_in_cache`] took in place: counts them as bytes read
    /// through the page cache. Their checksums are checked where they lie as their rows are
    /// used ([`ColdPool::group_in_place`]), on the threads that copy those rows: a check here
    /// would bring every group into a cache far from the copies, and check groups read ahead
    /// that the step then does not use.
    pub(super) fn read_in_place(&self, layer: usize, head: usize, in_place: &[(usize, usize)]) -> Result<()> {
        let Some(&(first, _)) = in_place.first() else { return Ok(()) };
        let file = self.file_of(head);
        if let Some(faults) = &self.faults {
            faults.on_read(layer, head, first);
            if let Some(e) = faults.on_read_done(layer) {
                return Err(io_error("read failed", &file.path, e));
            }
        }
        let bytes = (in_place.len() * self.layout.disk_group_bytes()) as u64;
        self.stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        self.stats.bytes_read_cached.fetch_add(bytes, Ordering::Relaxed);
        file.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// (layer, head)'s group `group`, read in place where it lies (`physical`), once checked
    /// against its checksum. Each read checks it again: a page the cache dropped and read back
    /// may have come from a damaged disk, and nothing says which did. (Trusting a group while
    /// its pages stayed mapped, as `/proc/self/pagemap` tells, saved no time: the rows copied
    /// then miss the cache instead.)
    pub(super) fn group_in_place(&self, layer: usize, head: usize, group: usize, physical: usize) -> Result<&[u8]> {
        let dgb = self.layout.disk_group_bytes();
        let bytes = &self.lane_in_place(layer, head)[physical * dgb..][..dgb];
        self.check_in_place(layer, head, group, physical, bytes)?;
        Ok(bytes)
    }

    /// Checks (layer, head)'s group `group`, read in place as `bytes` where it lies
    /// (`physical`), against its checksum.
    fn check_in_place(&self, layer: usize, head: usize, group: usize, physical: usize, bytes: &[u8]) -> Result<()> {
        self.check_group(layer, head, group, self.layout.group_index(layer, head, physical), bytes)
    }

    /// (layer, head)'s region of its file as the page cache holds it, for groups read in place.
    fn lane_in_place(&self, layer: usize, head: usize) -> &[u8] {
        let mapping = self.file_of(head).mapping.as_ref().expect("groups are read in place only from a mapped file");
        mapping.bytes(self.lane_range(layer, head))
    }

    /// Bytes of (layer, head)'s region (its blocks and the spare) in its head's file.
    fn lane_range(&self, layer: usize, head: usize) -> Range<usize> {
        let start = self.file_offset(layer, head, 0) as usize;
        start..start + self.layout.lane_groups() * self.layout.disk_group_bytes()
    }
}

/// Groups `first .. first + count` of one KV head, to be read into the start of `dst` (which
/// must start at the pool's [`ColdType::alignment`]) as `staging` says.
pub struct GroupRun<'a> {
    pub head: usize,
    pub first: usize,
    pub count: usize,
    pub dst: &'a mut [u8],
    pub staging: Staging,
}

/// How a read leaves each group in its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// As f16 rows (K then V), [`ColdLayout::group_bytes`] each: decoded, for a q8 pool.
    F16,
    /// As the file keeps it, [`ColdLayout::disk_group_bytes`] each: checked, not decoded (see
    /// [`ColdType::decode_row`]). A q8 pool's reads then take five-eighths of the
    /// memory.
    AsKept,
}

/// A page-aligned group's bytes as the f16 words (bits) they hold.
fn f16_words(bytes: &[u8]) -> &[u16] {
    // SAFETY: any bytes are valid u16s; `align_to` puts none in the head when aligned.
    let (head, words, _) = unsafe { bytes.align_to::<u16>() };
    assert!(head.is_empty(), "groups are page-aligned");
    words
}

fn f16_words_mut(bytes: &mut [u8]) -> &mut [u16] {
    // SAFETY: as in `f16_words`.
    let (head, words, _) = unsafe { bytes.align_to_mut::<u16>() };
    assert!(head.is_empty(), "groups are page-aligned");
    words
}

/// Opens a new pool file with O_DIRECT, or buffered where the filesystem refuses O_DIRECT or
/// direct I/O at `alignment` (a q8 pool's sectors on a drive of 4 KiB sectors).
fn open_pool_file(path: &Path, alignment: usize) -> Result<File> {
    let open = |flags: i32| {
        OpenOptions::new().read(true).write(true).create_new(true).mode(0o600).custom_flags(flags).open(path)
    };
    let refused = match open(libc::O_DIRECT) {
        Ok(file) if alignment >= IO_ALIGN || allows_direct_io_at(&file, alignment) => return Ok(file),
        Ok(_) => format!("the drive refuses direct I/O in {alignment}-byte units"),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => "the filesystem refuses direct I/O".to_string(),
        Err(e) => return Err(io_error("cannot create its file", path, e)),
    };
    let _ = std::fs::remove_file(path);
    tracing::warn!(dir = %path.parent().unwrap_or(path).display(), "{refused}; cold pool uses buffered I/O");
    open(0).map_err(|e| io_error("cannot create its file", path, e))
}

/// Whether a direct write of `alignment` bytes, at that offset in the file and in memory, is
/// accepted (the file is new: what it writes is zeros where nothing was).
fn allows_direct_io_at(file: &File, alignment: usize) -> bool {
    let buf = AlignedBuf::zeroed(2 * alignment);
    file.write_all_at(&buf.as_bytes()[alignment..2 * alignment], alignment as u64).is_ok()
}

fn sweep_once(dir: &Path) {
    let mut swept = SWEPT.lock().unwrap_or_else(|p| p.into_inner());
    if swept.get_or_insert_with(HashSet::new).insert(dir.to_path_buf()) {
        let removed = sweep_stale(dir);
        if removed > 0 {
            tracing::info!(dir = %dir.display(), removed, "removed cold pool files left by a crashed process");
        }
    }
}

/// Removes pool files in `dir` whose owning process is gone; returns how many.
pub fn sweep_stale(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| {
            n.strip_prefix(FILE_PREFIX)?.strip_suffix(FILE_SUFFIX)?.split('-').next()?.parse::<u32>().ok()
        }) else {
            continue;
        };
        let alive = Path::new("/proc").join(pid.to_string()).exists();
        if !alive && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// A handle on a cold pool's scoring-key chunks and nothing else: what the XRT evaluator
/// writes as the sequence grows and its card reads peer to peer. The pool stays the file's one
/// owner.
#[derive(Clone)]
pub struct KeyChunkSection(Arc<ColdPool>);

impl KeyChunkFile for KeyChunkSection {
    fn write(&self, layer: usize, chunk: usize, buf: &AlignedBuf) -> Result<()> {
        self.0.write_key_chunk(layer, chunk, buf)
    }

    /// Not counted as cold bytes read by the host.
    fn read(&self, layer: usize, chunk: usize, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.0.read_key_chunk(layer, chunk, offset, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::fault::{ColdFaults, FailingWrite};

    fn layout() -> ColdLayout {
        ColdLayout::f16(2, 3, 64, 8)
    }

    /// A test's directory, removed when the test ends (the pools remove their files, not it).
    fn temp_dir(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new().prefix(&format!("hillside-cold-{name}-")).tempdir().unwrap()
    }

    fn filled(pool: &ColdPool, seed: u16) -> AlignedBuf {
        let mut buf = pool.buffer(1);
        buf.as_u16_mut().iter_mut().enumerate().for_each(|(i, w)| *w = (i as u16).wrapping_mul(31).wrapping_add(seed));
        buf
    }

    #[test]
    fn key_chunks_live_after_the_groups_and_round_trip() {
        let scratch = temp_dir("key-chunks");
        let dir = scratch.path().to_path_buf();
        let chunk_bytes = 2 * IO_ALIGN;
        let pool = ColdPool::create_in(std::slice::from_ref(&dir), layout(), chunk_bytes).unwrap();
        // 8 groups of 16 tokens: one chunk of 256 tokens per layer, after every K/V group.
        assert_eq!(std::fs::metadata(pool.path()).unwrap().len(), layout().file_bytes() + 2 * chunk_bytes as u64);
        let mut chunk = AlignedBuf::zeroed(chunk_bytes);
        chunk.as_bytes_mut().iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        pool.write_key_chunk(1, 0, &chunk).unwrap();
        pool.write_group(1, 2, 7, &filled(&pool, 9)).unwrap(); // the last group, just before the keys
        let mut back = AlignedBuf::zeroed(IO_ALIGN);
        pool.read_key_chunk(1, 0, IO_ALIGN, back.as_bytes_mut()).unwrap();
        assert_eq!(back.as_bytes(), &chunk.as_bytes()[IO_ALIGN..]);
        let mut group = pool.buffer(1);
        pool.read_groups(1, 2, 7, 1, group.as_bytes_mut()).unwrap();
        assert_eq!(group.as_bytes(), filled(&pool, 9).as_bytes());
    }

    #[test]
    fn groups_round_trip_and_are_contiguous_per_head() {
        let scratch = temp_dir("roundtrip");
        let dir = scratch.path().to_path_buf();
        let pool = ColdPool::create(&dir, layout()).unwrap();
        assert_eq!(layout().group_bytes(), 4096, "16 tokens × 64 dims × f16 × (K, V) is one page");
        for g in 0..4 {
            pool.write_group(1, 2, g, &filled(&pool, g as u16)).unwrap();
        }
        let mut buf = pool.buffer(4);
        pool.read_groups(1, 2, 0, 4, buf.as_bytes_mut()).unwrap();
        for g in 0..4 {
            assert_eq!(&buf.as_bytes()[g * 4096..][..4096], filled(&pool, g as u16).as_bytes());
        }
        assert_eq!(pool.stats.reads.load(Ordering::Relaxed), 1);
        let path = pool.path().to_path_buf();
        assert!(path.exists());
        drop(pool);
        assert!(!path.exists(), "the file goes with the pool");
    }

    #[test]
    fn kv_heads_are_dealt_across_directories_and_each_file_holds_only_its_share() {
        let (scratch_a, scratch_b) = (temp_dir("devices-a"), temp_dir("devices-b"));
        let (a, b) = (scratch_a.path().to_path_buf(), scratch_b.path().to_path_buf());
        let dirs = [a.to_path_buf(), b.to_path_buf()];
        let pool = ColdPool::create_in(&dirs, layout(), 0).unwrap();
        let files: Vec<PathBuf> = pool.files.iter().map(|f| f.path.clone()).collect();
        // Heads 0 and 2 in the first directory, head 1 in the second: their regions only.
        let lane_bytes = (layout().lane_groups() * layout().group_bytes()) as u64;
        assert_eq!(std::fs::metadata(&files[0]).unwrap().len(), 2 * 2 * lane_bytes);
        assert_eq!(std::fs::metadata(&files[1]).unwrap().len(), 2 * lane_bytes);
        assert!(files[0].starts_with(&dirs[0]) && files[1].starts_with(&dirs[1]));
        for layer in 0..2 {
            for head in 0..3 {
                for g in 0..8 {
                    pool.write_group(layer, head, g, &filled(&pool, (layer * 100 + head * 10 + g) as u16)).unwrap();
                }
            }
        }
        // Every head's groups read back as written, one by one and in one batch over both files.
        let mut batch = pool.buffer(3 * 8);
        let mut rest = batch.as_bytes_mut();
        let mut runs = Vec::new();
        for head in 0..3 {
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(8 * 4096);
            runs.push(GroupRun { head, first: 0, count: 8, dst, staging: Staging::F16 });
            rest = tail;
        }
        if let Some(read) = pool.read_runs(1, &mut runs) {
            read.unwrap();
            for head in 0..3 {
                for g in 0..8 {
                    assert_eq!(
                        &batch.as_bytes()[(head * 8 + g) * 4096..][..4096],
                        filled(&pool, (100 + head * 10 + g) as u16).as_bytes()
                    );
                }
            }
        }
        for head in 0..3 {
            let mut one = pool.buffer(8);
            pool.read_groups(0, head, 0, 8, one.as_bytes_mut()).unwrap();
            for g in 0..8 {
                assert_eq!(
                    &one.as_bytes()[g * 4096..][..4096],
                    filled(&pool, (head * 10 + g) as u16).as_bytes(),
                    "head {head} group {g}"
                );
            }
        }
        // What each directory served: two heads' share and one head's.
        let per_dir = pool.bytes_read_per_dir();
        let read_all = pool.stats.bytes_read.load(Ordering::Relaxed);
        assert_eq!(per_dir.iter().sum::<u64>(), read_all);
        assert_eq!(per_dir[0], 2 * per_dir[1]);
        drop(pool);
        assert!(files.iter().all(|f| !f.exists()), "every file goes with the pool");
    }

    #[test]
    fn both_read_paths_see_the_last_write() {
        let scratch = temp_dir("dual-path");
        let dir = scratch.path().to_path_buf();
        let pool = ColdPool::create(&dir, layout()).unwrap();
        let mut buf = pool.buffer(1);
        pool.write_group(1, 0, 2, &filled(&pool, 1)).unwrap();
        pool.set_cached_lanes(layout().n_kv_heads * 2); // every lane through the page cache
        pool.read_groups(1, 0, 2, 1, buf.as_bytes_mut()).unwrap();
        assert_eq!(buf.as_bytes(), filled(&pool, 1).as_bytes());
        // A direct write over a page the cache holds: the cached read sees the new bytes.
        pool.write_group(1, 0, 2, &filled(&pool, 2)).unwrap();
        pool.read_groups(1, 0, 2, 1, buf.as_bytes_mut()).unwrap();
        assert_eq!(buf.as_bytes(), filled(&pool, 2).as_bytes());
        assert_eq!(pool.stats.bytes_read_cached.load(Ordering::Relaxed), 2 * 4096);
        pool.set_cached_lanes(layout().n_kv_heads); // lane 3 (layer 1, head 0) is direct again
        pool.read_groups(1, 0, 2, 1, buf.as_bytes_mut()).unwrap();
        assert_eq!(buf.as_bytes(), filled(&pool, 2).as_bytes());
        assert_eq!(pool.stats.bytes_read_cached.load(Ordering::Relaxed), 2 * 4096, "a direct read");
    }

    #[test]
    fn a_relocated_block_reads_back_new_and_a_failed_relocation_keeps_the_old() {
        let scratch = temp_dir("relocate");
        let dir = scratch.path().to_path_buf();
        let layout = ColdLayout::f16(2, 3, 64, 40);
        // Armed below: the write of layer 1's group 21 (in block 1) fails, after the block's first groups.
        let faults = ColdFaults {
            failing_write: Some(FailingWrite { layer: 1, group: 21, errno: libc::EIO, times: AtomicUsize::new(0) }),
            ..Default::default()
        };
        let faults = fault::inject(&dir, faults);
        let pool = ColdPool::create(&dir, layout).unwrap();
        assert_eq!(layout.lane_groups(), 4 * BLOCK_GROUPS, "three blocks and a spare");
        assert_eq!(std::fs::metadata(pool.path()).unwrap().len(), layout.file_bytes());
        for g in 0..40 {
            pool.write_group(1, 2, g, &filled(&pool, g as u16)).unwrap();
        }
        let gb = layout.group_bytes();
        let read = |first: usize, count: usize| {
            let mut buf = pool.buffer(count);
            pool.read_groups(1, 2, first, count, buf.as_bytes_mut()).map(|()| buf)
        };
        // Block 0 rewritten with other contents: reads see them, also in a read that spans
        // the moved block and the one after it, which now lie apart in the file.
        let mut block = pool.buffer(BLOCK_GROUPS);
        for (i, group) in block.as_bytes_mut().chunks_exact_mut(gb).enumerate() {
            group.copy_from_slice(filled(&pool, 100 + i as u16).as_bytes());
        }
        pool.relocate_block(1, 2, 0, block.as_bytes()).unwrap();
        let reads_before = pool.stats.reads.load(Ordering::Relaxed);
        let span = read(14, 4).unwrap();
        assert_eq!(pool.stats.reads.load(Ordering::Relaxed) - reads_before, 2, "one request per contiguous run");
        for (i, g) in (14..18).enumerate() {
            let want = if g < BLOCK_GROUPS { filled(&pool, 100 + g as u16) } else { filled(&pool, g as u16) };
            assert_eq!(&span.as_bytes()[i * gb..][..gb], want.as_bytes(), "group {g}");
        }
        // The old copy is the spare now: block 1 moves into it, and block 0 is untouched.
        pool.relocate_block(1, 2, 1, block.as_bytes()).unwrap();
        assert_eq!(&read(0, 1).unwrap().as_bytes()[..gb], filled(&pool, 100).as_bytes());
        assert_eq!(&read(16, 1).unwrap().as_bytes()[..gb], filled(&pool, 100).as_bytes());
        // A relocation whose write fails midway: the error says so and the block is as it was.
        faults.failing_write.as_ref().unwrap().times.store(1, Ordering::Relaxed);
        let err = pool.relocate_block(1, 2, 1, filled_block(&pool, 7).as_bytes()).unwrap_err().to_string();
        assert!(err.contains("write failed"), "{err}");
        assert_eq!(
            read(16, BLOCK_GROUPS).unwrap().as_bytes(),
            block.as_bytes(),
            "the block keeps its last good contents"
        );
        assert_eq!(read(32, 8).unwrap().as_bytes()[..gb], *filled(&pool, 32).as_bytes(), "other blocks untouched");
        fault::clear(&dir);
    }

    fn filled_block(pool: &ColdPool, seed: u16) -> AlignedBuf {
        let mut block = pool.buffer(BLOCK_GROUPS);
        block.as_u16_mut().iter_mut().enumerate().for_each(|(i, w)| *w = (i as u16).wrapping_mul(7).wrapping_add(seed));
        block
    }

    #[test]
    fn a_damaged_block_is_an_error() {
        let scratch = temp_dir("damaged");
        let dir = scratch.path().to_path_buf();
        let pool = ColdPool::create(&dir, layout()).unwrap();
        pool.write_group(0, 1, 3, &filled(&pool, 7)).unwrap();
        // Flip one byte behind the pool's back.
        let offset = pool.locate(0, 1, 3).0 + 100;
        let other = OpenOptions::new().write(true).open(pool.path()).unwrap();
        other.write_all_at(&[0xAB], offset).unwrap();
        other.sync_all().unwrap();
        let mut buf = pool.buffer(1);
        let err = pool.read_groups(0, 1, 3, 1, buf.as_bytes_mut()).unwrap_err().to_string();
        assert!(err.contains("checksum") && err.contains("tokens 48..64"), "{err}");
        let err = pool.read_groups(0, 1, 4, 1, buf.as_bytes_mut()).unwrap_err().to_string();
        assert!(err.contains("never written"), "{err}");
        // The same through a batch of runs, where the damaged group is one of several.
        pool.write_group(0, 0, 0, &filled(&pool, 1)).unwrap();
        let mut two = pool.buffer(2);
        let (a, b) = two.as_bytes_mut().split_at_mut(4096);
        let mut runs = [
            GroupRun { head: 0, first: 0, count: 1, dst: a, staging: Staging::F16 },
            GroupRun { head: 1, first: 3, count: 1, dst: b, staging: Staging::F16 },
        ];
        if let Some(read) = pool.read_runs(0, &mut runs) {
            let err = read.unwrap_err().to_string();
            assert!(err.contains("checksum") && err.contains("tokens 48..64"), "{err}");
        }
    }

    #[test]
    fn a_run_of_groups_is_written_where_its_blocks_lie_and_fails_at_a_faulty_group() {
        let scratch = temp_dir("write-run");
        let dir = scratch.path().to_path_buf();
        let layout = ColdLayout::f16(2, 3, 64, 40);
        let faults = ColdFaults {
            failing_write: Some(FailingWrite { layer: 1, group: 35, errno: libc::ENOSPC, times: AtomicUsize::new(1) }),
            ..Default::default()
        };
        fault::inject(&dir, faults);
        let pool = ColdPool::create(&dir, layout).unwrap();
        let gb = layout.group_bytes();
        // Block 0 moves to the spare, so groups 10..20 lie in two places in the file.
        pool.relocate_block(1, 2, 0, filled_block(&pool, 1).as_bytes()).unwrap();
        let mut run = pool.buffer(10);
        for (i, group) in run.as_bytes_mut().chunks_exact_mut(gb).enumerate() {
            group.copy_from_slice(filled(&pool, 50 + i as u16).as_bytes());
        }
        let writes_before = pool.stats.bytes_written.load(Ordering::Relaxed);
        pool.write_groups(1, 2, 10, 10, run.as_bytes()).unwrap();
        assert_eq!(pool.stats.bytes_written.load(Ordering::Relaxed) - writes_before, 10 * gb as u64);
        for g in 10..20 {
            let mut one = pool.buffer(1);
            pool.read_groups(1, 2, g, 1, one.as_bytes_mut()).unwrap();
            assert_eq!(one.as_bytes(), filled(&pool, 50 + (g - 10) as u16).as_bytes(), "group {g}");
        }
        // The write of group 35 fails (a full disk): the run's groups before it are written,
        // and the error says what happened.
        let err = pool.write_groups(1, 2, 30, 10, run.as_bytes()).unwrap_err();
        assert!(err.is_storage_full() && err.to_string().contains("write failed"), "{err}");
        let mut one = pool.buffer(1);
        pool.read_groups(1, 2, 34, 1, one.as_bytes_mut()).unwrap();
        let err = pool.read_groups(1, 2, 35, 1, one.as_bytes_mut()).unwrap_err().to_string();
        assert!(err.contains("never written"), "{err}");
        fault::clear(&dir);
    }

    #[test]
    fn a_batch_of_runs_reads_what_runs_read_one_by_one() {
        let scratch = temp_dir("batch");
        let dir = scratch.path().to_path_buf();
        let layout = ColdLayout::f16(2, 3, 64, 40);
        let pool = ColdPool::create(&dir, layout).unwrap();
        for head in 0..3 {
            for g in 0..40 {
                pool.write_group(1, head, g, &filled(&pool, (head * 100 + g) as u16)).unwrap();
            }
        }
        // Block 0 of head 2 moves, so a run across groups 14..18 lies in two places in the file.
        pool.relocate_block(1, 2, 0, filled_block(&pool, 5).as_bytes()).unwrap();
        let wanted = [(0, 0, 3), (2, 14, 4), (1, 39, 1), (2, 30, 10)];
        let groups: usize = wanted.iter().map(|w| w.2).sum();
        let mut batch = pool.buffer(groups);
        let mut rest = batch.as_bytes_mut();
        let mut runs = Vec::new();
        for &(head, first, count) in &wanted {
            let (dst, tail) = std::mem::take(&mut rest).split_at_mut(count * layout.group_bytes());
            runs.push(GroupRun { head, first, count, dst, staging: Staging::F16 });
            rest = tail;
        }
        let Some(read) = pool.read_runs(1, &mut runs) else {
            eprintln!("io_uring is unavailable here: tiered reads go through the I/O threads");
            return;
        };
        read.unwrap();
        let mut at = 0;
        for &(head, first, count) in &wanted {
            let mut one = pool.buffer(count);
            pool.read_groups(1, head, first, count, one.as_bytes_mut()).unwrap();
            let bytes = count * layout.group_bytes();
            assert_eq!(
                batch.as_bytes()[at..at + bytes],
                one.as_bytes()[..bytes],
                "head {head}, groups {first}..{}",
                first + count
            );
            at += bytes;
        }
    }

    /// f16 words of K/V-like values (a spread of magnitudes) for group `seed`.
    fn kv_like(pool: &ColdPool, count: usize, seed: usize) -> AlignedBuf {
        let mut buf = pool.buffer(count);
        for (i, w) in buf.as_u16_mut().iter_mut().enumerate() {
            *w = half::f16::from_f32(((i * 7919 + seed * 104_729) % 4001) as f32 / 1000.0 - 2.0).to_bits();
        }
        buf
    }

    fn within_half_a_step(got: &[u8], want: &[u8]) -> bool {
        let value = |b: &[u8]| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        // Values lie in [-2, 2]: a q8 step is at most 2/127.
        got.chunks_exact(2).zip(want.chunks_exact(2)).all(|(g, w)| (value(g) - value(w)).abs() <= 1.0 / 127.0 + 1e-3)
    }

    #[test]
    fn q8_groups_take_five_sectors_and_read_back_within_half_a_step_on_every_path() {
        let scratch = temp_dir("q8");
        let dir = scratch.path().to_path_buf();
        let layout = ColdLayout { cold_type: ColdType::Q8, ..ColdLayout::f16(2, 3, 64, 40) };
        let pool = ColdPool::create(&dir, layout).unwrap();
        let (gb, dgb) = (layout.group_bytes(), layout.disk_group_bytes());
        assert_eq!((gb, dgb), (4096, 2560));
        assert_eq!(std::fs::metadata(pool.path()).unwrap().len(), layout.file_bytes());
        let groups = kv_like(&pool, 40, 1);
        pool.write_groups(1, 2, 0, 40, groups.as_bytes()).unwrap();
        assert_eq!(pool.stats.bytes_written.load(Ordering::Relaxed), 40 * 2560);
        let want = |g: usize, n: usize| &groups.as_bytes()[g * gb..(g + n) * gb];
        // One run, whole (the last groups decode over their own bytes), and one group alone.
        let mut buf = pool.buffer(40);
        pool.read_groups(1, 2, 0, 40, buf.as_bytes_mut()).unwrap();
        assert!(within_half_a_step(&buf.as_bytes()[..40 * gb], want(0, 40)));
        assert_ne!(&buf.as_bytes()[..40 * gb], want(0, 40), "q8 is not exact");
        assert_eq!(pool.stats.bytes_read.load(Ordering::Relaxed), 40 * 2560, "what the disk moved");
        let mut one = pool.buffer(1);
        pool.read_groups(1, 2, 39, 1, one.as_bytes_mut()).unwrap();
        assert_eq!(one.as_bytes(), &buf.as_bytes()[39 * gb..40 * gb], "a group decodes alike in any run");
        // Through the page cache, and a relocated block read across its new place.
        pool.set_cached_lanes(2 * 3);
        let mut cached = pool.buffer(2);
        pool.read_groups(1, 2, 7, 2, cached.as_bytes_mut()).unwrap();
        assert_eq!(cached.as_bytes(), &buf.as_bytes()[7 * gb..9 * gb]);
        assert_eq!(pool.stats.bytes_read_cached.load(Ordering::Relaxed), 2 * 2560);
        pool.set_cached_lanes(0);
        let block = kv_like(&pool, BLOCK_GROUPS, 2);
        pool.relocate_block(1, 2, 0, block.as_bytes()).unwrap();
        let mut span = pool.buffer(4);
        pool.read_groups(1, 2, 14, 4, span.as_bytes_mut()).unwrap();
        assert!(within_half_a_step(&span.as_bytes()[..2 * gb], &block.as_bytes()[14 * gb..16 * gb]));
        assert_eq!(&span.as_bytes()[2 * gb..4 * gb], &buf.as_bytes()[16 * gb..18 * gb]);
        // The batched reads decode as the single ones.
        if let Some(read) = {
            let mut batch = pool.buffer(3);
            let (a, b) = batch.as_bytes_mut().split_at_mut(gb);
            let mut runs = [
                GroupRun { head: 2, first: 39, count: 1, dst: a, staging: Staging::F16 },
                GroupRun { head: 2, first: 20, count: 2, dst: b, staging: Staging::F16 },
            ];
            pool.read_runs(1, &mut runs).map(|r| r.map(|()| batch))
        } {
            let batch = read.unwrap();
            assert_eq!(&batch.as_bytes()[..gb], &buf.as_bytes()[39 * gb..40 * gb]);
            assert_eq!(&batch.as_bytes()[gb..3 * gb], &buf.as_bytes()[20 * gb..22 * gb]);
        }
        // Staged as kept: five-eighths of the bytes, and the same rows once decoded; the second
        // run starts at a sector boundary that is no page boundary.
        let mut kept = AlignedBuf::zeroed(3 * dgb);
        let (single, batched) = kept.as_bytes_mut().split_at_mut(dgb);
        pool.read_run(1, &mut GroupRun { head: 2, first: 39, count: 1, dst: single, staging: Staging::AsKept })
            .unwrap();
        let mut runs = [GroupRun { head: 2, first: 20, count: 2, dst: batched, staging: Staging::AsKept }];
        if let Some(read) = pool.read_runs(1, &mut runs) {
            read.unwrap();
        } else {
            pool.read_run(1, &mut runs[0]).unwrap();
        }
        let mut rows = vec![0u16; gb / 2];
        for (group, at) in [(39, 0), (20, dgb), (21, 2 * dgb)] {
            layout.cold_type.decode_group(&kept.as_bytes()[at..][..dgb], 64, &mut rows);
            assert_eq!(f16_words(&buf.as_bytes()[group * gb..][..gb]), &rows[..], "group {group}");
        }
        // A flipped byte in a q8 group is caught before it is decoded.
        let offset = pool.locate(1, 2, 30).0 + 100;
        let other = OpenOptions::new().write(true).open(pool.path()).unwrap();
        other.write_all_at(&[0xAB], offset).unwrap();
        other.sync_all().unwrap();
        let err = pool.read_groups(1, 2, 30, 1, one.as_bytes_mut()).unwrap_err().to_string();
        assert!(err.contains("checksum") && err.contains("tokens 480..496"), "{err}");
        // Staged as kept, too: nothing decodes it later, so the read itself must refuse it.
        let err = pool
            .read_run(
                1,
                &mut GroupRun { head: 2, first: 29, count: 2, dst: kept.as_bytes_mut(), staging: Staging::AsKept },
            )
            .unwrap_err();
        assert!(err.to_string().contains("tokens 480..496"), "{err}");
    }

    #[test]
    fn files_of_dead_processes_are_swept_and_live_ones_kept() {
        let scratch = temp_dir("sweep");
        let dir = scratch.path().to_path_buf();
        let dead_pid = (4_000_000..4_100_000).find(|p| !Path::new(&format!("/proc/{p}")).exists()).unwrap();
        let stale = dir.join(format!("{FILE_PREFIX}{dead_pid}-0{FILE_SUFFIX}"));
        std::fs::write(&stale, b"left by a crash").unwrap();
        let pool = ColdPool::create(&dir, layout()).unwrap();
        assert_eq!(sweep_stale(&dir), 0, "the creating call already swept");
        assert!(!stale.exists());
        assert!(pool.path().exists(), "a live process's pool is kept");
    }
}
