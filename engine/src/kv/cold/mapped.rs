//! A read-only mapping of a cold-pool file, through which the groups the page cache already
//! holds are read in place: checked against their checksums where they lie, and their rows
//! copied straight from there, instead of each group being copied whole by the kernel into a
//! staging buffer first.
//!
//! Only groups read through the page cache since they were last written are touched, and only
//! in the lanes that measured headroom keeps there. Were one evicted since, touching it reads it
//! back from the disk (a synchronous fault), and a disk that failed that read would end the
//! process with SIGBUS: the price of reading in place, as for any memory-mapped file.

use std::fs::File;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

pub(super) struct MappedFile {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a read-only mapping owned by this value; nothing writes through it.
unsafe impl Send for MappedFile {}
unsafe impl Sync for MappedFile {}

impl MappedFile {
    /// Maps the first `len` bytes of `file` for reading.
    pub fn map(file: &File, len: usize) -> std::io::Result<Self> {
        // SAFETY: a fresh shared read-only mapping of an open file; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(std::ptr::null_mut(), len.max(1), libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        // A touched page that left the cache is one group's fault, not the start of a scan: no
        // read-ahead around it. (A hint: nothing depends on it.)
        // SAFETY: the range is our mapping.
        unsafe { libc::madvise(ptr, len.max(1), libc::MADV_RANDOM) };
        Ok(Self { ptr: NonNull::new(ptr.cast()).expect("mmap returns a non-null address"), len })
    }

    /// The file's bytes in `range`, as the page cache holds them.
    ///
    /// The pool's owner never rewrites a group while a read of it is staged (see
    /// [`super::staged::Staged`]), so these bytes hold still while they are in use.
    pub fn bytes(&self, range: Range<usize>) -> &[u8] {
        assert!(range.start <= range.end && range.end <= self.len, "a range of the mapping");
        // SAFETY: the range lies in our live read-only mapping, which outlives `&self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(range.start), range.len()) }
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // SAFETY: unmaps our own mapping; no slice of it outlives `self`.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len.max(1)) };
    }
}
