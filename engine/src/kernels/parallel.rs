//! Helpers for splitting kernel work over the compute threads.

use std::marker::PhantomData;

/// Lets parallel tasks write disjoint parts of one output slice that are not contiguous chunks
/// (for example one row range of every token in a token-major matrix).
pub struct DisjointWriter<'a, T = f32> {
    ptr: *mut T,
    len: usize,
    _borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: the writer only hands out writes through `write`, whose contract requires that no two
// tasks write the same index; with that, sharing it across threads is like sharing `&mut` parts.
unsafe impl<T: Send> Send for DisjointWriter<'_, T> {}
unsafe impl<T: Send> Sync for DisjointWriter<'_, T> {}

impl<'a, T> DisjointWriter<'a, T> {
    pub fn new(out: &'a mut [T]) -> Self {
        Self { ptr: out.as_mut_ptr(), len: out.len(), _borrow: PhantomData }
    }

    /// Writes `value` at `index`.
    ///
    /// # Safety
    /// No other task may read or write `index` while the writer is alive.
    #[inline]
    pub unsafe fn write(&self, index: usize, value: T) {
        assert!(index < self.len, "DisjointWriter index {index} out of bounds {}", self.len);
        // SAFETY: in bounds (checked above); exclusive per the caller's contract.
        unsafe { self.ptr.add(index).write(value) }
    }

    /// `len` values from `start`, to fill in place.
    ///
    /// # Safety
    /// No other task may touch these values while the slice is alive.
    #[allow(clippy::mut_from_ref)] // exclusive per the caller's contract, as for `write`
    pub unsafe fn slice(&self, start: usize, len: usize) -> &mut [T] {
        assert!(start + len <= self.len, "DisjointWriter slice {start}+{len} out of bounds {}", self.len);
        // SAFETY: in bounds (checked above); exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// How many pieces to cut `work_items` into so that every thread gets a few.
pub fn task_count(work_items: usize, min_items_per_task: usize) -> usize {
    let threads = super::spin_pool::pool().threads();
    let by_size = work_items.div_ceil(min_items_per_task.max(1));
    by_size.clamp(1, (threads * 4).max(1))
}
