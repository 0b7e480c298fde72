//! Fixed-size rows of f16 bits in one anonymous mapping, reserved for the rows a pool expects
//! to hold (and remapped larger if it ever needs more), backed by memory only where rows are
//! written.
//!
//! The hot pool reads thousands of rows per step from scattered slots; with 4 KiB pages nearly
//! every row read is a TLB miss as well as a cache miss. A mapping of its own can ask for
//! transparent huge pages (2 MiB), grows without copying, and gives its tail back to the kernel
//! when the pool shrinks.

use std::ptr::NonNull;

pub struct RowSlab {
    ptr: NonNull<u16>,
    row_words: usize,
    capacity_rows: usize,
    len_rows: usize,
}

// SAFETY: the slab owns its mapping exclusively, like a Vec<u16>.
unsafe impl Send for RowSlab {}
unsafe impl Sync for RowSlab {}

/// The huge page size the reservation is advised for; also how much is given back at once.
const HUGE_PAGE_BYTES: usize = 2 << 20;

impl RowSlab {
    /// Room for `capacity_rows` rows of `row_words` f16 values to start with; no memory is
    /// used until rows are pushed.
    pub fn new(row_words: usize, capacity_rows: usize) -> Self {
        let bytes = Self::map_bytes(row_words, capacity_rows);
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        let ptr = Self::mapped(ptr, bytes);
        Self { ptr, row_words, capacity_rows: bytes / (2 * row_words), len_rows: 0 }
    }

    /// The mapping's address, advised for huge pages; out of address space is out of memory.
    fn mapped(ptr: *mut libc::c_void, bytes: usize) -> NonNull<u16> {
        if ptr == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(bytes, HUGE_PAGE_BYTES).expect("a valid layout"),
            );
        }
        // A hint: where transparent huge pages are off, the slab simply uses small pages.
        // SAFETY: the range is our mapping.
        unsafe { libc::madvise(ptr, bytes, libc::MADV_HUGEPAGE) };
        NonNull::new(ptr.cast()).expect("mmap returns a non-null address")
    }

    /// Doubles the room, moving the mapping if it must (rows are only reached through `self`).
    fn grow(&mut self) {
        let (old, new) = (
            Self::map_bytes(self.row_words, self.capacity_rows),
            Self::map_bytes(self.row_words, 2 * self.capacity_rows),
        );
        // SAFETY: remaps our own mapping; every pointer into it is derived from `self.ptr` anew.
        let ptr = unsafe { libc::mremap(self.ptr.as_ptr().cast(), old, new, libc::MREMAP_MAYMOVE) };
        self.ptr = Self::mapped(ptr, new);
        self.capacity_rows = new / (2 * self.row_words);
    }

    fn map_bytes(row_words: usize, capacity_rows: usize) -> usize {
        (row_words * 2 * capacity_rows).next_multiple_of(HUGE_PAGE_BYTES).max(HUGE_PAGE_BYTES)
    }

    pub(crate) fn len(&self) -> usize {
        self.len_rows
    }

    /// Adds a row (zeroed, or whatever a truncated row held) and returns its index.
    pub fn push(&mut self) -> usize {
        if self.len_rows == self.capacity_rows {
            self.grow();
        }
        self.len_rows += 1;
        self.len_rows - 1
    }

    pub fn row(&self, i: usize) -> &[u16] {
        assert!(i < self.len_rows);
        // SAFETY: row i lies inside the mapping (i < len ≤ capacity), which is readable and
        // zero-filled on first touch; &self forbids writers.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(i * self.row_words), self.row_words) }
    }

    pub fn row_mut(&mut self, i: usize) -> &mut [u16] {
        assert!(i < self.len_rows);
        // SAFETY: as in `row`, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(i * self.row_words), self.row_words) }
    }

    pub fn copy_row(&mut self, from: usize, to: usize) {
        assert!(from < self.len_rows && to < self.len_rows);
        // SAFETY: both rows lie inside the mapping; `copy` allows overlap (from == to).
        unsafe {
            std::ptr::copy(
                self.ptr.as_ptr().add(from * self.row_words),
                self.ptr.as_ptr().add(to * self.row_words),
                self.row_words,
            )
        };
    }

    /// Keeps the first `rows` rows and gives the memory of whole huge pages past them back.
    pub fn truncate(&mut self, rows: usize) {
        self.len_rows = self.len_rows.min(rows);
        let keep = (self.len_rows * self.row_words * 2).next_multiple_of(HUGE_PAGE_BYTES);
        let total = Self::map_bytes(self.row_words, self.capacity_rows);
        if keep < total {
            // SAFETY: the range is a page-aligned tail of our own mapping with no live rows;
            // it reads as zeros if touched again.
            unsafe {
                libc::madvise(self.ptr.as_ptr().cast::<u8>().add(keep).cast(), total - keep, libc::MADV_DONTNEED)
            };
        }
    }
}

impl Drop for RowSlab {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, with its length.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), Self::map_bytes(self.row_words, self.capacity_rows)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_survive_growth_and_truncation_gives_memory_back() {
        let row_words = 256;
        let mut slab = RowSlab::new(row_words, 10);
        for i in 0..20_000 {
            let r = slab.push();
            slab.row_mut(r).fill(i as u16);
        }
        assert_eq!(slab.row(12_345)[7], 12_345);
        slab.copy_row(19_999, 3);
        assert_eq!(slab.row(3)[0], 19_999);
        slab.truncate(100);
        assert_eq!(slab.len(), 100);
        assert_eq!(slab.row(99)[255], 99);
        // Rows pushed again past the old end start from zeroed pages, not stale data.
        for _ in 0..10_000 {
            slab.push();
        }
        assert_eq!(slab.row(9_999)[0], 0);
    }
}
