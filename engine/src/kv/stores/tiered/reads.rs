//! The tiered store's cold reads: a layer's own, on reader threads while the resident rows are
//! copied, and the same reads issued ahead of a layer's turn.
//!
//! A layer's query exists only once the layer before it has run, but consecutive steps select
//! mostly the same tokens. So while layer l computes, the [`Prefetcher`] already reads the
//! groups that layers l+1.. selected last step and that are still cold; at their turn only the
//! groups the prediction missed are read. Groups read for nothing cost bandwidth, and count in
//! the pool's read statistics like any other read.
//!
//! Staging is bounded whatever the context: a read-ahead stages at most [`READ_AHEAD_BYTES`],
//! and a layer's own reads go in pieces of [`READ_PIECE_BYTES`], a few in flight, each copied
//! out as it lands. The hot budget reserves [`staging_bound_bytes`] for them.

use crate::aligned::{AlignedBuf, IO_ALIGN};
use crate::error::{Error, Result};
use crate::kv::cold::staged::{read_heads, ReadPlan, Staged};
use crate::kv::cold::ColdPool;
use std::collections::VecDeque;
use std::sync::{mpsc, Arc, Mutex, OnceLock};

/// Bytes a layer's read-ahead stages at most: about what the disk reads while a layer computes.
/// The rest of the layer's predicted groups are read at its turn, with the prediction's misses.
pub(super) const READ_AHEAD_BYTES: usize = 8 << 20;

/// Bytes one piece of a layer's own reads stages at most.
pub(super) const READ_PIECE_BYTES: usize = 1 << 20;

/// Pieces of a layer's own reads in flight at once: one lands and is copied out while the next
/// is read.
const PIECES_IN_FLIGHT: usize = 2;

/// The most the store's read buffers hold at once (a read-ahead, and a layer's own pieces in
/// flight), for a cache whose whole layer takes `layer_bytes` in the cold pool.
pub fn staging_bound_bytes(layer_bytes: usize) -> usize {
    let whole_pages = |bytes: usize| bytes.next_multiple_of(IO_ALIGN);
    whole_pages(READ_AHEAD_BYTES.min(layer_bytes)) + PIECES_IN_FLIGHT * whole_pages(READ_PIECE_BYTES.min(layer_bytes))
}

/// A read running on a reader thread, with the buffer it reads into.
pub(super) struct PendingRead(mpsc::Receiver<(Result<Staged>, AlignedBuf)>);

impl PendingRead {
    /// Starts reading what `plan` says of `layer`, copies into `buf`, grown here if too small:
    /// buffers allocated on the reader threads would land in their own malloc arenas and keep
    /// the process's memory up.
    pub fn start(cold: &Arc<ColdPool>, layer: usize, plan: ReadPlan, mut buf: AlignedBuf) -> Self {
        let need = plan.copied_bytes(cold);
        if buf.len() < need {
            buf = AlignedBuf::zeroed(need);
        }
        let (tx, done) = mpsc::channel();
        let cold = cold.clone();
        run_on_reader(Box::new(move || {
            let staged = read_heads(&cold, layer, plan, &mut buf);
            let _ = tx.send((staged, buf)); // the store may have moved on; then the read is dropped
        }));
        Self(done)
    }

    /// Waits for the read: what it staged (or its error), and the buffer back.
    pub fn wait(self) -> (Result<Staged>, AlignedBuf) {
        self.0
            .recv()
            .unwrap_or_else(|_| (Err(Error::Internal("a cold-pool read panicked".into())), AlignedBuf::zeroed(0)))
    }
}

/// Groups read ahead for one layer, and the buffer that holds them.
pub(super) struct Prefetched {
    pub staged: Staged,
    pub buf: AlignedBuf,
}

struct InFlight {
    layer: usize,
    /// The groups being read.
    plan: ReadPlan,
    read: PendingRead,
}

/// Reads issued ahead of their layer's turn, in layer order, and the buffers that every
/// cold-pool read of the store (ahead or at a layer's turn) reads into: one for the read-ahead
/// and one for each piece in flight, each made once at the most it may hold (pages it never
/// writes take no memory), so that staging stays within [`staging_bound_bytes`] and buffers
/// are not reallocated as reads vary (freed, they would go back to the heap, not the system).
pub(super) struct Prefetcher {
    in_flight: VecDeque<InFlight>,
    /// The size of the read-ahead's buffer, and of each piece's.
    ahead_bytes: usize,
    piece_bytes: usize,
    /// The read-ahead's buffer, between reads.
    ahead_buf: Option<AlignedBuf>,
    /// The pieces' buffers, between reads.
    piece_bufs: Vec<AlignedBuf>,
}

impl Prefetcher {
    /// Buffers for a cache whose whole layer takes `layer_bytes` in the cold pool.
    pub fn new(layer_bytes: usize) -> Self {
        Self {
            in_flight: VecDeque::new(),
            ahead_bytes: READ_AHEAD_BYTES.min(layer_bytes),
            piece_bytes: READ_PIECE_BYTES.min(layer_bytes),
            ahead_buf: None,
            piece_bufs: Vec::new(),
        }
    }

    pub fn is_issued(&self, layer: usize) -> bool {
        self.in_flight.iter().any(|f| f.layer == layer)
    }

    /// What is being read ahead for `layer`, if anything: known before it lands, so that the
    /// layer's other reads start without waiting for it.
    pub fn issued(&self, layer: usize) -> Option<&ReadPlan> {
        self.in_flight.iter().find(|f| f.layer == layer).map(|f| &f.plan)
    }

    /// Starts reading what `plan` says of `layer` on a reader thread (its copies at most
    /// [`READ_AHEAD_BYTES`]: see [`ReadPlan::truncated`]).
    pub fn issue(&mut self, cold: &Arc<ColdPool>, layer: usize, plan: ReadPlan) {
        let buf = self.ahead_buf.take().unwrap_or_else(|| AlignedBuf::zeroed(self.ahead_bytes));
        let read = PendingRead::start(cold, layer, plan.clone(), buf);
        self.in_flight.push_back(InFlight { layer, plan, read });
    }

    /// A buffer for a piece of a layer's own reads (at most [`READ_PIECE_BYTES`]).
    pub fn piece_buffer(&mut self) -> AlignedBuf {
        self.piece_bufs.pop().unwrap_or_else(|| AlignedBuf::zeroed(self.piece_bytes))
    }

    /// A piece's buffer, done with.
    pub fn recycle_piece(&mut self, buf: AlignedBuf) {
        if self.piece_bufs.len() < PIECES_IN_FLIGHT {
            self.piece_bufs.push(buf);
        }
    }

    /// A read-ahead's buffer, done with (one is kept, should two have been in use).
    pub fn recycle_ahead(&mut self, buf: AlignedBuf) {
        self.ahead_buf.get_or_insert(buf);
    }

    /// What was read ahead for `layer`, once it is there; reads for earlier layers that were
    /// never claimed are dropped. A failed read is logged and left to the regular path.
    pub fn take(&mut self, layer: usize) -> Option<Prefetched> {
        while let Some(f) = self.in_flight.front() {
            if f.layer > layer {
                return None;
            }
            let f = self.in_flight.pop_front()?;
            let (staged, buf) = f.read.wait();
            if f.layer < layer {
                self.recycle_ahead(buf);
                continue;
            }
            return match staged {
                Ok(staged) => Some(Prefetched { staged, buf }),
                Err(e) => {
                    tracing::warn!(error = %e, layer, "read-ahead failed; reading at the layer's turn");
                    self.recycle_ahead(buf);
                    None
                }
            };
        }
        None
    }

    /// Waits for every read in flight and drops what it read, unseen: after a truncation or a
    /// re-placement the groups they read may be rewritten, and no read may still be running
    /// while they are (it could read a block half-moved).
    pub fn clear(&mut self) {
        while let Some(f) = self.in_flight.pop_front() {
            let (_, buf) = f.read.wait();
            self.recycle_ahead(buf);
        }
    }

    /// Memory held by buffers between reads.
    pub fn bytes(&self) -> usize {
        self.ahead_buf.as_ref().map_or(0, AlignedBuf::len) + self.piece_bufs.iter().map(AlignedBuf::len).sum::<usize>()
    }
}

/// A layer's own reads at its turn, in pieces: [`PIECES_IN_FLIGHT`] read at once, the next one
/// started as a landed one's buffer comes back.
pub(super) struct LayerReads {
    layer: usize,
    waiting: VecDeque<ReadPlan>,
    in_flight: VecDeque<PendingRead>,
}

impl LayerReads {
    /// Starts reading `plan` of `layer`, in pieces, with buffers from `buffers`.
    pub fn start(cold: &Arc<ColdPool>, layer: usize, plan: ReadPlan, buffers: &mut Prefetcher) -> Self {
        let waiting = plan.into_pieces(cold, READ_PIECE_BYTES).into();
        let mut reads = Self { layer, waiting, in_flight: VecDeque::new() };
        reads.top_up(cold, buffers);
        reads
    }

    /// Starts pieces until [`PIECES_IN_FLIGHT`] are in flight, or none are left to start.
    pub fn top_up(&mut self, cold: &Arc<ColdPool>, buffers: &mut Prefetcher) {
        while self.in_flight.len() < PIECES_IN_FLIGHT {
            let Some(plan) = self.waiting.pop_front() else { return };
            let buf = buffers.piece_buffer();
            self.in_flight.push_back(PendingRead::start(cold, self.layer, plan, buf));
        }
    }

    /// The next piece in flight, to wait for; `None` once all have landed.
    pub fn next(&mut self) -> Option<PendingRead> {
        self.in_flight.pop_front()
    }

    /// Whether the piece [`LayerReads::next`] gave last was the last one.
    pub fn is_drained(&self) -> bool {
        self.waiting.is_empty() && self.in_flight.is_empty()
    }
}

impl Drop for LayerReads {
    /// Pieces left in flight (after a failed one) are waited for: no read may outlive its
    /// layer's turn, as the groups it reads may be rewritten after (see [`Prefetcher::clear`]).
    fn drop(&mut self) {
        self.in_flight.drain(..).for_each(|read| drop(read.wait()));
    }
}

/// A whole read, for a reader thread.
type ReadJob = Box<dyn FnOnce() + Send>;

/// Runs `job` on one of the reader threads: plain threads that each drive one whole read at a
/// time (all of its requests through the thread's io_uring, or handed to the I/O threads where
/// there is none) and sleep on a queue in between. A decode step issues two reads a layer (the
/// layer's own, and the next layer's read-ahead). Spawned on the rayon I/O pool, each woke
/// workers that spin and yield before they sleep again, which on 2 cores took CPU from the step
/// and started each read ten times later (docs/decisions/tiered-step-on-two-cores.md).
fn run_on_reader(job: ReadJob) {
    static QUEUE: OnceLock<mpsc::Sender<ReadJob>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<ReadJob>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..READER_THREADS {
            let rx = rx.clone();
            let reader = move || loop {
                let Ok(job) = rx.lock().unwrap_or_else(|p| p.into_inner()).recv() else { return };
                // A read that panics drops its reply channel, and its waiter gets an error; the
                // thread stays for the next read.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            };
            std::thread::Builder::new()
                .name(format!("hillside-read-{i}"))
                .spawn(reader)
                .expect("starting a cold-pool reader thread");
        }
        tx
    });
    // The readers live as long as the process: the send cannot fail.
    let _ = queue.send(job);
}

/// Reads one process runs at once: a layer's own and its read-ahead, for two sequences
/// decoding side by side. More wait in the queue.
const READER_THREADS: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::cold::{ColdLayout, GROUP_TOKENS};

    /// A pool whose every group holds its own (layer, head, group) in each f16 word.
    fn pool(dir: &std::path::Path) -> Arc<ColdPool> {
        let layout = ColdLayout::f16(3, 2, 8, 6);
        let pool = ColdPool::create(dir, layout).unwrap();
        let mut page = pool.buffer(1);
        for layer in 0..3 {
            for head in 0..2 {
                for group in 0..6 {
                    page.as_u16_mut().fill((layer * 100 + head * 10 + group) as u16);
                    pool.write_group(layer, head, group, &page).unwrap();
                }
            }
        }
        Arc::new(pool)
    }

    #[test]
    fn a_read_that_panics_fails_its_waiter_and_the_readers_go_on() {
        use std::sync::mpsc::RecvTimeoutError;
        use std::time::Duration;
        // Minutes: only a hang fails here, never a slow machine.
        let patience = Duration::from_secs(120);
        for _ in 0..2 * READER_THREADS {
            let (tx, rx) = mpsc::channel::<()>();
            run_on_reader(Box::new(move || {
                let _reply = tx;
                panic!("a read failed in a way nobody foresaw (injected)");
            }));
            assert_eq!(
                rx.recv_timeout(patience),
                Err(RecvTimeoutError::Disconnected),
                "the waiter learns the read ended without a reply"
            );
        }
        let (tx, rx) = mpsc::channel();
        run_on_reader(Box::new(move || tx.send(7).unwrap()));
        assert_eq!(rx.recv_timeout(patience), Ok(7), "every reader still takes reads");
    }

    #[test]
    fn read_ahead_brings_the_groups_asked_for_and_drops_what_is_not_claimed() {
        let scratch = tempfile::Builder::new().prefix("hillside-read-ahead-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let cold = pool(&dir);
        let gb = cold.layout().disk_group_bytes();
        // An f16 group's `i`th word.
        let word = |page: &[u8], i: usize| u16::from_le_bytes([page[2 * i], page[2 * i + 1]]) as usize;
        let mut prefetch = Prefetcher::new(2 * 6 * gb);
        let plan = |layer, groups| ReadPlan::new(&cold, layer, groups);
        prefetch.issue(&cold, 1, plan(1, vec![vec![0, 1, 4], vec![5]]));
        prefetch.issue(&cold, 2, plan(2, vec![vec![2], vec![]]));
        assert!(prefetch.is_issued(1) && prefetch.is_issued(2) && !prefetch.is_issued(0));
        assert!(prefetch.take(0).is_none(), "nothing was read ahead for layer 0");

        let got = prefetch.take(1).expect("layer 1 was read ahead");
        // Groups 2 and 3 of head 0 bridge two that were asked for.
        for (head, group) in [(0, 0), (0, 1), (0, 2), (0, 3), (0, 4), (1, 5)] {
            let page = got.staged.group(&cold, &got.buf, head, group).unwrap().unwrap();
            assert!((0..gb / 2).all(|i| word(page, i) == 100 + head * 10 + group), "layer 1 head {head} group {group}");
        }
        assert!(got.staged.group(&cold, &got.buf, 0, 5).unwrap().is_none());
        assert!(got.staged.group(&cold, &got.buf, 1, 0).unwrap().is_none());
        // The dense index finds the same groups, and none that were not read.
        for head in 0..3 {
            let pages = got.staged.head_pages(&cold, &got.buf, head);
            for group in 0..8 {
                assert_eq!(
                    pages.get(group).unwrap(),
                    got.staged.group(&cold, &got.buf, head, group).unwrap(),
                    "head {head} group {group}"
                );
            }
        }
        prefetch.recycle_ahead(got.buf);

        // A read for a later layer waits for its turn; clear forgets it.
        assert!(prefetch.take(1).is_none() && prefetch.is_issued(2));
        prefetch.clear();
        assert!(!prefetch.is_issued(2) && prefetch.take(2).is_none());
        // Claiming a layer drops the unclaimed reads of the layers before it.
        prefetch.issue(&cold, 0, plan(0, vec![vec![3], vec![3]]));
        prefetch.issue(&cold, 2, plan(2, vec![vec![3], vec![]]));
        let got = prefetch.take(2).expect("layer 2 was read ahead");
        assert_eq!(word(got.staged.group(&cold, &got.buf, 0, 3).unwrap().unwrap(), 0), 203);
        assert!(!prefetch.is_issued(0));

        // The same reads at the layer's turn.
        let mut buf = AlignedBuf::zeroed(0);
        let staged = read_heads(&cold, 2, plan(2, vec![vec![1, 2], vec![0]]), &mut buf).unwrap();
        assert_eq!(word(staged.group(&cold, &buf, 1, 0).unwrap().unwrap(), 0), 210);
        assert_eq!(word(staged.group(&cold, &buf, 0, 2).unwrap().unwrap(), GROUP_TOKENS), 202);
        drop(cold);
    }
}
