//! Helpers for splitting kernel work over the compute threads.

use std::marker::PhantomData;
use std::sync::Mutex;

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

/// `f` of every item, spread over the compute threads (the caller's among them), in the items'
/// order. For the host's own loops in a decode step: handed to rayon instead, the caller
/// would sleep until a rayon thread woke to take the work and woke it back.
pub fn map_items<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    let slots: Vec<Mutex<(Option<T>, Option<R>)>> =
        items.into_iter().map(|item| Mutex::new((Some(item), None))).collect();
    super::spin_pool::pool().run(slots.len(), &|i| {
        let item = slots[i].lock().unwrap_or_else(|e| e.into_inner()).0.take().expect("each task runs once");
        let result = f(item);
        slots[i].lock().unwrap_or_else(|e| e.into_inner()).1 = Some(result);
    });
    slots
        .into_iter()
        .map(|slot| slot.into_inner().unwrap_or_else(|e| e.into_inner()).1.expect("every task ran"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_map_in_order_on_any_thread() {
        let items: Vec<Vec<u32>> = (0..50).map(|i| vec![i; i as usize]).collect();
        let sums = map_items(items, |v| v.iter().sum::<u32>());
        assert_eq!(sums, (0..50u32).map(|i| i * i).collect::<Vec<_>>());
        assert!(map_items(Vec::<u8>::new(), |x| x).is_empty());
    }
}
