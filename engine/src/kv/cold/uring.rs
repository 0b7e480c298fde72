//! Many reads in flight from one thread, through io_uring.
//!
//! A selection's cold reads are thousands of requests of a few 4 KiB pages. Issued from a pool of
//! threads, each costs a system call and a context switch; an io_uring submits them in batches
//! and keeps a deeper queue, which reads small pages faster than many threads. Each thread that
//! reads keeps its own ring. Where the kernel refuses io_uring (old kernels, seccomp in containers,
//! `kernel.io_uring_disabled`), [`read_all`] says so and the caller reads another way.

use io_uring::{opcode, types, IoUring};
use std::cell::RefCell;
use std::io;
use std::os::fd::RawFd;

/// Requests in flight at once: of the depths measured on the development VM's virtio disk (32
/// and 128), the faster.
const QUEUE_DEPTH: u32 = 128;

/// One read: `dst.len()` bytes of `fd` from `offset`.
pub struct ReadAt<'a> {
    pub fd: RawFd,
    pub offset: u64,
    pub dst: &'a mut [u8],
}

thread_local! {
    /// This thread's ring: not tried yet (`None`), refused (`Some(None)`), or ready.
    static RING: RefCell<Option<Option<IoUring>>> = const { RefCell::new(None) };
}

/// Whether this thread can read through io_uring (it sets up its ring on the first call).
pub fn available() -> bool {
    with_ring(|ring| ring.is_some())
}

/// The first request that failed, by its index in the batch, and why.
#[derive(Debug)]
pub struct ReadFailed {
    pub request: usize,
    pub error: io::Error,
}

/// Reads every request in full, or returns the first failure. `None` when this thread cannot
/// use io_uring; nothing was read then.
pub fn read_all(reads: &mut [ReadAt<'_>]) -> Option<Result<(), ReadFailed>> {
    with_ring(|ring| ring.map(|ring| run(ring, reads)))
}

fn with_ring<T>(f: impl FnOnce(Option<&mut IoUring>) -> T) -> T {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ring = slot.get_or_insert_with(|| match IoUring::new(QUEUE_DEPTH) {
            Ok(ring) => Some(ring),
            Err(e) => {
                tracing::info!(error = %e, "io_uring unavailable; cold-pool reads use a thread pool");
                None
            }
        });
        f(ring.as_mut())
    })
}

fn run(ring: &mut IoUring, reads: &mut [ReadAt<'_>]) -> Result<(), ReadFailed> {
    // Bytes of each read done so far: a read may come back short and is then resubmitted for the rest.
    let mut done = vec![0usize; reads.len()];
    let mut next = 0;
    let mut in_flight = 0usize;
    let mut first_error = None;
    loop {
        while first_error.is_none() && next < reads.len() && in_flight < QUEUE_DEPTH as usize {
            submit(ring, &mut reads[next], 0, next);
            next += 1;
            in_flight += 1;
        }
        if in_flight == 0 {
            break;
        }
        wait(ring);
        let completed: Vec<(usize, i32)> = ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
        for (i, result) in completed {
            in_flight -= 1;
            let left = reads[i].dst.len() - done[i];
            match result {
                n if n > 0 && (n as usize) < left => {
                    done[i] += n as usize;
                    if first_error.is_none() {
                        submit(ring, &mut reads[i], done[i], i);
                        in_flight += 1;
                    }
                }
                n if n > 0 => done[i] += n as usize,
                0 => {
                    _ = first_error
                        .get_or_insert_with(|| ReadFailed { request: i, error: io::ErrorKind::UnexpectedEof.into() })
                }
                e if -e == libc::EINTR || -e == libc::EAGAIN => {
                    if first_error.is_none() {
                        submit(ring, &mut reads[i], done[i], i);
                        in_flight += 1;
                    }
                }
                e => {
                    _ = first_error
                        .get_or_insert_with(|| ReadFailed { request: i, error: io::Error::from_raw_os_error(-e) })
                }
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Queues the rest of `read` from byte `from` on, tagged `tag`. The submission queue has room:
/// no more than [`QUEUE_DEPTH`] requests are ever in flight.
fn submit(ring: &mut IoUring, read: &mut ReadAt<'_>, from: usize, tag: usize) {
    let rest = &mut read.dst[from..];
    let entry = opcode::Read::new(types::Fd(read.fd), rest.as_mut_ptr(), rest.len() as u32)
        .offset(read.offset + from as u64)
        .build()
        .user_data(tag as u64);
    // SAFETY: the kernel writes into `rest` until the request completes. `run` holds the
    // exclusive borrow of every `dst` and never returns while a request is in flight (it waits
    // for each completion, on errors too), so the memory stays valid and unaliased meanwhile.
    unsafe { ring.submission().push(&entry).expect("the submission queue holds QUEUE_DEPTH requests") };
}

/// Submits what is queued and waits for at least one completion.
fn wait(ring: &mut IoUring) {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => return,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => continue,
            // Requests are in flight into buffers the caller may free once we return: neither
            // returning nor unwinding is safe, and the ring cannot be waited on any more.
            Err(e) => {
                tracing::error!(error = %e, "io_uring failed with reads in flight");
                std::process::abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn reads_many_ranges_of_a_file_in_full() {
        let scratch = tempfile::Builder::new().prefix("hillside-uring-").tempdir().unwrap();
        let dir = scratch.path().to_path_buf();
        let path = dir.join("data");
        let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
        std::fs::File::create(&path).unwrap().write_all(&data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // More requests than the queue holds, of odd sizes and offsets.
        let ranges: Vec<(usize, usize)> = (0..500).map(|i| ((i * 7919) % 1_000_000, 1 + (i * 131) % 4000)).collect();
        let mut bufs: Vec<Vec<u8>> = ranges.iter().map(|&(_, len)| vec![0; len]).collect();
        let mut reads: Vec<ReadAt> = ranges
            .iter()
            .zip(&mut bufs)
            .map(|(&(at, _), dst)| ReadAt { fd: file.as_raw_fd(), offset: at as u64, dst })
            .collect();
        match read_all(&mut reads) {
            None => eprintln!("io_uring is unavailable here; the thread-pool path is what runs"),
            Some(result) => {
                result.unwrap();
                for (&(at, len), buf) in ranges.iter().zip(&bufs) {
                    assert_eq!(buf[..], data[at..at + len]);
                }
            }
        }
        // Past the end of the file: an error, not a hang or a silent short buffer.
        let mut tail = vec![0u8; 4096];
        let mut past = [ReadAt { fd: file.as_raw_fd(), offset: data.len() as u64 - 100, dst: &mut tail }];
        if let Some(result) = read_all(&mut past) {
            let failed = result.unwrap_err();
            assert_eq!((failed.request, failed.error.kind()), (0, io::ErrorKind::UnexpectedEof));
        }
    }
}
