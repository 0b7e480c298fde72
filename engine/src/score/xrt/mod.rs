//! The XRT evaluator: the cold pool's tokens scored on a SmartSSD's FPGA (HillInfer §4.2, §4.4).
//!
//! Each layer's scoring keys reach the SSD in chunks of [`CHUNK_TOKENS`] in the kernel's layout
//! as the sequence grows ([`XrtEvaluator::store_chunks`]). To rank a layer's cold tokens, a
//! worker thread reads each needed chunk with direct I/O into the card's peer-to-peer buffers
//! (NAND → FPGA DDR, no DRAM on the way), runs `hillside_score` on it and sends the chunk's
//! (position, score) block up the same bounded channel the storage evaluator uses; the tokens
//! not yet in a whole chunk on the SSD are scored on the host with the same arithmetic, so the
//! selection is exactly the storage evaluator's.
//!
//! Where XRT, the card or the kernel is missing, [`XrtEvaluator::open`] says why in one line and
//! the caller uses the storage evaluator. If the card fails mid-decode, the worker logs it once,
//! lets go of the card and scores the rest on the host from the DRAM copy of the keys (which is
//! kept for exactly this): the decode goes on.

mod api;
mod error;
pub mod probe;

pub use probe::{probe, Probe};

use super::contract::KeyChunkFile;
use super::contract::{DeviceQuery, KeyChunkLayout, CHUNK_TOKENS};
use super::storage::score_on_host;
use super::worker::Worker;
use super::{KeyBits, ScoreBlock, ScoringKeys, SCORE_BLOCK_TOKENS};
use crate::aligned::AlignedBuf;
use crate::error::Result;
use api::{Arg, Buffer, Device, Kernel, Run, Xrt};
pub use error::XrtError;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, RwLock};

/// The kernel's name in the xclbin (`fpga/kernel/score_kernel.cpp`).
pub const KERNEL_NAME: &str = "hillside_score";

/// Where XRT's C API lives, when neither the config nor `HILLSIDE_XRT_LIBRARY` says: XRT's own
/// install, then Debian's packages.
const STANDARD_LIBRARIES: [&str; 3] = [
    "/opt/xilinx/xrt/lib/libxrt_coreutil.so",
    "/usr/lib/x86_64-linux-gnu/libxrt_coreutil.so.2",
    "/usr/lib64/libxrt_coreutil.so.2",
];

/// Which XRT library, xclbin and card to use (each from the config, else the environment).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct XrtOptions {
    /// `libxrt_coreutil.so` (or the emulator built from `fpga/emu/`).
    pub library: Option<PathBuf>,
    /// The scoring kernel's xclbin.
    pub xclbin: Option<PathBuf>,
    /// Card index.
    pub device: u32,
}

impl XrtOptions {
    /// The library to load: configured, `HILLSIDE_XRT_LIBRARY`, `$XILINX_XRT/lib`, then the
    /// standard install paths.
    pub fn library_path(&self) -> PathBuf {
        let env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        self.library
            .clone()
            .or_else(|| env("HILLSIDE_XRT_LIBRARY"))
            .or_else(|| env("XILINX_XRT").map(|dir| dir.join("lib/libxrt_coreutil.so")).filter(|p| p.exists()))
            .or_else(|| STANDARD_LIBRARIES.iter().map(PathBuf::from).find(|p| p.exists()))
            .unwrap_or_else(|| PathBuf::from(STANDARD_LIBRARIES[0]))
    }

    /// The xclbin to load: configured, `HILLSIDE_XCLBIN`, then `hillside_score.xclbin` in
    /// Hillside's data directory.
    pub fn xclbin_path(&self) -> Option<PathBuf> {
        let data_dir = std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .map(|d| d.join("hillside").join(format!("{KERNEL_NAME}.xclbin")));
        self.xclbin
            .clone()
            .or_else(|| std::env::var_os("HILLSIDE_XCLBIN").filter(|v| !v.is_empty()).map(PathBuf::from))
            .or(data_dir.filter(|p| p.exists()))
    }
}

/// What the evaluator did, for stats and tests.
#[derive(Debug, Default)]
pub struct XrtCounters {
    /// Tokens the card scored (the rest are scored on the host: not yet in a whole chunk on
    /// the SSD, or after a failure).
    pub device_tokens: AtomicU64,
    pub runs: AtomicU64,
    /// Set when the card failed and the host took over for good.
    pub failed: AtomicBool,
}

struct Request {
    layer: usize,
    keys: Arc<RwLock<ScoringKeys>>,
    query: Arc<DeviceQuery>,
    tokens: Vec<u32>,
    /// Chunks of every layer on the SSD when the request was made.
    chunks: usize,
    reply: SyncSender<ScoreBlock>,
}

pub struct XrtEvaluator {
    worker: Worker<Request>,
    keys: Arc<dyn KeyChunkFile>,
    layout: KeyChunkLayout,
    /// Chunks written to the SSD, for every sparse layer.
    chunks: usize,
    staging: AlignedBuf,
    counters: Arc<XrtCounters>,
    description: String,
}

impl XrtEvaluator {
    /// Opens the card `options` name and prepares the kernel for keys of this shape, or says in
    /// one line why it cannot. `keys` must hold chunks of `layout`'s size.
    pub fn open(options: &XrtOptions, keys: Arc<dyn KeyChunkFile>, layout: KeyChunkLayout) -> Result<Self> {
        if !super::contract::supports(layout.bits, layout.head_dim) {
            return Err(XrtError::UnsupportedShape { head_dim: layout.head_dim, bits: layout.bits }.into());
        }
        let found = probe(options);
        if let Some(problem) = found.problem {
            return Err(XrtError::Unusable(problem).into());
        }
        // The probe loaded the same library, card and xclbin in a child: safe to do here.
        let xrt = Xrt::load(&found.library)?;
        let device = xrt.open_device(options.device).ok_or(XrtError::DeviceGone(options.device))?;
        let xclbin = found.xclbin.clone().ok_or(XrtError::NoXclbin)?;
        let kernel = device.load_xclbin(&xclbin).and_then(|uuid| device.open_kernel(&uuid, KERNEL_NAME))?;
        let session = Session::new(device, kernel, layout)?;
        let description =
            format!("{} via {}, {}", xclbin.display(), found.library.display(), found.version.unwrap_or_default());
        let counters = Arc::new(XrtCounters::default());
        let worker = {
            let (keys, counters) = (keys.clone(), counters.clone());
            Worker::spawn("hillside-xrt-eval", move |inbox| serve(Some(session), &*keys, inbox, &counters))
                .map_err(XrtError::Worker)?
        };
        Ok(Self {
            worker,
            staging: AlignedBuf::zeroed(layout.chunk_bytes()),
            keys,
            layout,
            chunks: 0,
            counters,
            description,
        })
    }

    /// The xclbin, library and version in use.
    pub fn description(&self) -> &str {
        &self.description
    }

    pub fn counters(&self) -> &XrtCounters {
        &self.counters
    }

    /// Writes to the SSD every chunk now whole among the first `cold_tokens` tokens, for each
    /// of `layers` (`keys[layer]`), so the card can score them.
    pub fn store_chunks(
        &mut self,
        keys: &[Arc<RwLock<ScoringKeys>>],
        layers: std::ops::Range<usize>,
        cold_tokens: usize,
    ) -> Result<()> {
        while (self.chunks + 1) * CHUNK_TOKENS <= cold_tokens {
            for layer in layers.clone() {
                let keys = keys[layer].read().unwrap_or_else(|p| p.into_inner());
                self.layout.fill(&keys, self.chunks, self.staging.as_bytes_mut());
                self.keys.write(layer, self.chunks, &self.staging)?;
            }
            self.chunks += 1;
        }
        Ok(())
    }

    /// Forgets chunks past `n_tokens` (they are rewritten once whole again).
    pub fn truncate(&mut self, n_tokens: usize) {
        self.chunks = self.chunks.min(n_tokens / CHUNK_TOKENS);
    }

    /// Starts scoring `tokens` (ascending) of `layer` against `query`; blocks arrive on the
    /// returned channel as each is done, and it closes when all are.
    pub fn score(
        &self,
        layer: usize,
        keys: Arc<RwLock<ScoringKeys>>,
        query: Arc<DeviceQuery>,
        tokens: Vec<u32>,
    ) -> Receiver<ScoreBlock> {
        let (reply, blocks) = Worker::<Request>::reply_channel();
        self.worker.send(Request { layer, keys, query, tokens, chunks: self.chunks, reply });
        blocks
    }
}

/// One run's buffers: keys and scales are peer-to-peer buffers the SSD writes into.
struct Slot {
    keys: Buffer,
    scales: Buffer,
    blocks: Buffer,
    blocks_done: Buffer,
}

/// The card's side: the kernel and two slots of buffers, allocated once in the banks the
/// kernel's arguments are connected to, so chunk i+1 is read from the SSD while chunk i is
/// scored.
struct Session {
    kernel: Kernel,
    query: Buffer,
    slots: [Slot; 2],
    layout: KeyChunkLayout,
    // Dropped last: buffers and kernel belong to it.
    _device: Device,
}

impl Session {
    fn new(device: Device, kernel: Kernel, layout: KeyChunkLayout) -> Result<Self> {
        let entries = layout.n_heads * CHUNK_TOKENS * 8;
        let slot = || -> Result<Slot> {
            Ok(Slot {
                keys: device.alloc(layout.keys_bytes(), kernel.group_id(0)?, true)?,
                scales: device.alloc(layout.scales_bytes(), kernel.group_id(1)?, true)?,
                blocks: device.alloc(entries, kernel.group_id(3)?, false)?,
                blocks_done: device.alloc(4, kernel.group_id(4)?, false)?,
            })
        };
        Ok(Self {
            slots: [slot()?, slot()?],
            query: device.alloc(layout.query_bytes(), kernel.group_id(2)?, false)?,
            kernel,
            layout,
            _device: device,
        })
    }

    fn load_query(&mut self, query: &DeviceQuery) -> Result<()> {
        self.layout.fill_query(query, self.query.as_mut_slice());
        self.query.sync_to_device()
    }

    /// SSD → card: the chunk's keys and scales into a slot's P2P buffers.
    fn read(&mut self, keys: &dyn KeyChunkFile, layer: usize, chunk: usize, slot: usize) -> Result<()> {
        let (l, s) = (self.layout, &mut self.slots[slot]);
        keys.read(layer, chunk, 0, &mut s.keys.as_mut_slice()[..l.keys_bytes()])?;
        keys.read(layer, chunk, l.keys_bytes(), &mut s.scales.as_mut_slice()[..l.scales_bytes()])
    }

    fn start(&self, chunk: usize, slot: usize) -> Result<Run> {
        let (l, s) = (self.layout, &self.slots[slot]);
        let bits = match l.bits {
            KeyBits::Int8 => 8,
            KeyBits::Int4 => 4,
        };
        self.kernel.start(&[
            Arg::Buffer(&s.keys),
            Arg::Buffer(&s.scales),
            Arg::Buffer(&self.query),
            Arg::Buffer(&s.blocks),
            Arg::Buffer(&s.blocks_done),
            Arg::U32(l.n_heads as u32),
            Arg::U32(CHUNK_TOKENS as u32),
            Arg::U32(bits),
            Arg::U32(l.head_dim as u32),
            Arg::U32(SCORE_BLOCK_TOKENS as u32),
            Arg::U32((chunk * CHUNK_TOKENS) as u32),
        ])
    }

    /// The score block of `tokens` (all in `chunk`) from a finished run's slot.
    fn collect(&self, chunk: usize, slot: usize, query: &DeviceQuery, tokens: &[u32]) -> Result<ScoreBlock> {
        let s = &self.slots[slot];
        s.blocks.sync_from_device()?;
        let (entries, first) = (s.blocks.as_slice(), (chunk * CHUNK_TOKENS) as u32);
        let mut block = ScoreBlock::new(tokens.to_vec(), self.layout.n_heads);
        let n = tokens.len();
        for h in 0..self.layout.n_heads {
            for (i, &t) in tokens.iter().enumerate() {
                let at = (h * CHUNK_TOKENS + (t - first) as usize) * 8;
                let entry = u64::from_le_bytes(entries[at..at + 8].try_into().expect("8 bytes"));
                if entry as u32 != t {
                    return Err(XrtError::WrongPosition { returned: entry as u32, expected: t }.into());
                }
                block.scores[h * n + i] = query.rescale(h, f32::from_bits((entry >> 32) as u32));
            }
        }
        block.produced = std::time::Instant::now();
        Ok(block)
    }

    /// Scores `tokens` (ascending, all on the SSD) chunk by chunk, handing each block to `emit`
    /// as soon as it is collected; stops early when `emit` returns false. While the card scores
    /// one chunk, the next is already on its way from the SSD.
    fn score(
        &mut self,
        keys: &dyn KeyChunkFile,
        layer: usize,
        query: &DeviceQuery,
        tokens: &[u32],
        mut emit: impl FnMut(ScoreBlock) -> bool,
    ) -> Result<()> {
        let mut chunks = Vec::new(); // (chunk, its tokens)
        let mut rest = tokens;
        while let Some(&t) = rest.first() {
            let chunk = t as usize / CHUNK_TOKENS;
            let n = rest.partition_point(|&u| u as usize / CHUNK_TOKENS == chunk);
            chunks.push((chunk, &rest[..n]));
            rest = &rest[n..];
        }
        let Some(&(first, _)) = chunks.first() else { return Ok(()) };
        self.load_query(query)?;
        self.read(keys, layer, first, 0)?;
        let mut running = Some(self.start(first, 0)?);
        if let Some(&(second, _)) = chunks.get(1) {
            self.read(keys, layer, second, 1)?;
        }
        for (i, &(chunk, chunk_tokens)) in chunks.iter().enumerate() {
            running.take().expect("a run per chunk").wait()?;
            if let Some(&(next, _)) = chunks.get(i + 1) {
                running = Some(self.start(next, (i + 1) % 2)?);
            }
            let block = self.collect(chunk, i % 2, query, chunk_tokens)?;
            if !emit(block) {
                return Ok(());
            }
            if let Some(&(after, _)) = chunks.get(i + 2) {
                self.read(keys, layer, after, i % 2)?;
            }
        }
        Ok(())
    }
}

/// The worker: one request at a time, the card's chunks first, then what only the host has.
fn serve(
    mut session: Option<Session>,
    on_ssd_keys: &dyn KeyChunkFile,
    inbox: Receiver<Request>,
    counters: &XrtCounters,
) {
    for req in inbox {
        let keys = req.keys.read().unwrap_or_else(|p| p.into_inner());
        let on_ssd = req.tokens.partition_point(|&t| (t as usize) < req.chunks * CHUNK_TOKENS);
        // Advanced past each block sent, so after a failure the host scores exactly the rest.
        let mut rest = &req.tokens[..];
        let mut listening = true;
        if let Some(card) = session.as_mut() {
            let sent = card.score(on_ssd_keys, req.layer, &req.query, &req.tokens[..on_ssd], |block| {
                counters.runs.fetch_add(1, Ordering::Relaxed);
                counters.device_tokens.fetch_add(block.tokens.len() as u64, Ordering::Relaxed);
                rest = &rest[block.tokens.len()..];
                listening = req.reply.send(block).is_ok();
                listening
            });
            if let Err(e) = sent {
                tracing::warn!(error = %e, "the SmartSSD failed; the host scores the cold pool from here on");
                counters.failed.store(true, Ordering::Relaxed);
                session = None;
            }
        }
        if !listening {
            continue; // the host stopped listening
        }
        for chunk in rest.chunks(SCORE_BLOCK_TOKENS) {
            if req.reply.send(score_on_host(&keys, &req.query, chunk)).is_err() {
                break;
            }
        }
    }
}
