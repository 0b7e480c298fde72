//! Page-aligned byte buffers, as direct I/O (O_DIRECT) requires for reads and writes.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

/// Alignment (and length granularity) of direct-I/O buffers.
pub const IO_ALIGN: usize = 4096;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `len` bytes, rounded up to whole pages (at least one).
    pub fn zeroed(len: usize) -> Self {
        let size = len.max(1).div_ceil(IO_ALIGN) * IO_ALIGN;
        let layout = Layout::from_size_align(size, IO_ALIGN).expect("page-aligned layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        Self { ptr, layout }
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for `size` initialized (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }

    /// The buffer as 16-bit words (f16 bits); the page alignment satisfies u16's.
    pub fn as_u16(&self) -> &[u16] {
        // SAFETY: 4096-byte alignment ≥ 2, and the size is a multiple of 2.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast::<u16>(), self.layout.size() / 2) }
    }

    pub fn as_u16_mut(&mut self) -> &mut [u16] {
        // SAFETY: as above, with exclusive access through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<u16>(), self.layout.size() / 2) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}
