//! Weight buffers in transparent huge pages. A decode step streams every weight once; in 4 KiB
//! pages each 4 KiB of a matrix costs a TLB miss and the hardware prefetcher stops at every page
//! boundary, where a 2 MiB page holds 512 of them. Most distributions leave huge pages to the
//! programs that ask (`madvise` mode), so the weights ask.

/// The size of a transparent huge page on x86-64 and most arm64 kernels.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// An empty vector with room for `len` values, whose whole 2 MiB pages are advised for huge
/// pages before anything touches them. A hint: where huge pages are off, or on other systems,
/// the buffer simply has small pages.
pub fn vec_in_huge_pages<T>(len: usize) -> Vec<T> {
    let v = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    {
        let start = v.as_ptr() as usize;
        let end = start + v.capacity() * std::mem::size_of::<T>();
        let (first, last) = (start.next_multiple_of(HUGE_PAGE_BYTES), end / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES);
        if last > first {
            // SAFETY: the range lies inside the vector's allocation; advice changes no contents.
            unsafe { libc::madvise(first as *mut libc::c_void, last - first, libc::MADV_HUGEPAGE) };
        }
    }
    v
}

/// `parts` one after another in a buffer of [`vec_in_huge_pages`], allocated once at its size.
pub fn concat_in_huge_pages<T: Copy>(parts: &[&[T]]) -> Vec<T> {
    let mut joined = vec_in_huge_pages(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        joined.extend_from_slice(part);
    }
    joined
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_are_joined_in_order_into_one_allocation_of_their_size() {
        let (a, b, c) = ([1u16, 2, 3], [4u16], [5u16, 6]);
        let joined = concat_in_huge_pages(&[&a, &b, &c]);
        assert_eq!(joined, [1, 2, 3, 4, 5, 6]);
        assert_eq!(joined.capacity(), 6);
        assert!(concat_in_huge_pages::<u8>(&[]).is_empty());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_buffer_of_whole_huge_pages_is_advised_for_them() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            // A kernel without transparent huge pages refuses the advice; the buffer is still
            // a plain vector.
            assert_eq!(vec_in_huge_pages::<u8>(8 << 20).capacity(), 8 << 20);
            return;
        }
        let v = vec_in_huge_pages::<u8>(8 << 20);
        let inside = (v.as_ptr() as usize).next_multiple_of(HUGE_PAGE_BYTES);
        // The mapping that holds the first whole huge page carries the advice (`hg`).
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut in_range = false;
        let mut flags = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
                let (start, end) = range.split_once('-').unwrap();
                let (start, end) = (usize::from_str_radix(start, 16), usize::from_str_radix(end, 16));
                in_range = matches!((start, end), (Ok(s), Ok(e)) if s <= inside && inside < e);
            } else if in_range && line.starts_with("VmFlags:") {
                flags = Some(line.to_string());
            }
        }
        let flags = flags.expect("the buffer's mapping is in /proc/self/smaps");
        assert!(flags.split_whitespace().any(|f| f == "hg"), "not advised: {flags}");
        drop(v);
    }
}
