//! Zeroed, 64-byte aligned line storage; large filters get huge pages.
//!
//! A lookup in a filter much larger than the CPU caches costs a cache miss
//! and, with 4 KiB pages, a TLB miss as well: at 10^8 keys a filter spans
//! ~30,000 pages, far more than the TLB holds. Storage of 2 MiB or more is
//! therefore an anonymous mapping advised `MADV_HUGEPAGE` (where the kernel
//! allows transparent huge pages on request), which also comes zeroed from
//! the kernel without a memset. Smaller storage is an ordinary `Vec`.
//!
//! The `unsafe` code here keeps a pointer to the lines next to their owner,
//! so that every access is a plain slice (no per-access match or alignment
//! check on the hot path).

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use bytemuck::{Pod, Zeroable};

use crate::error::{Error, Result};

/// One 64-byte cache line of eight 64-bit words; the unit of allocation.
///
/// ```
/// use bloomgate_filter::{Bitmap, Line, LINE_BITS};
/// let mut b = Bitmap::new(LINE_BITS).unwrap();
/// b.set(3).unwrap();
/// assert_eq!(Line([8, 0, 0, 0, 0, 0, 0, 0]).0[0], b.words()[0]);
/// assert_eq!(std::mem::align_of::<Line>(), 64);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Pod, Zeroable)]
#[repr(C, align(64))]
pub struct Line(pub [u64; 8]);

/// Bits in one [`Line`].
pub const LINE_BITS: u64 = 512;

/// Storage at or above this size is mapped with huge pages.
const HUGE_PAGE_THRESHOLD: usize = 2 << 20;

/// The owner of the memory; held only so that it is freed with `Storage`.
#[derive(Debug)]
#[allow(dead_code)]
enum Inner {
    Heap(Vec<Line>),
    Mapped(memmap2::MmapMut),
}

/// Owned, zero-initialised lines.
#[derive(Debug)]
pub(crate) struct Storage {
    /// Owns the memory `ptr` points into; never resized or replaced.
    _owner: Inner,
    ptr: NonNull<Line>,
    lines: usize,
}

// SAFETY: `Storage` owns its lines exclusively, like a `Vec<Line>` (which is
// `Send` and `Sync`): `ptr` points into memory owned by `_owner`, and shared
// access only hands out `&[Line]`, mutable access `&mut [Line]`.
unsafe impl Send for Storage {}
// SAFETY: as above.
unsafe impl Sync for Storage {}

impl Storage {
    /// `lines` zeroed lines.
    pub(crate) fn zeroed(lines: usize) -> Result<Self> {
        let bytes = lines.checked_mul(64).ok_or(Error::TooLarge {
            bits: lines as u128 * 512,
        })?;
        if bytes >= HUGE_PAGE_THRESHOLD {
            if let Ok(mut map) = memmap2::MmapOptions::new().len(bytes).map_anon() {
                #[cfg(target_os = "linux")]
                {
                    // Only a hint: without THP the mapping works the same.
                    let _ = map.advise(memmap2::Advice::HugePage);
                }
                if let Ok(view) = bytemuck::try_cast_slice_mut::<u8, Line>(&mut map) {
                    let ptr = NonNull::from(&mut view[0]);
                    return Ok(Self {
                        _owner: Inner::Mapped(map),
                        ptr,
                        lines,
                    });
                }
            }
        }
        let mut v: Vec<Line> = bytemuck::zeroed_vec(lines);
        // A `Vec`'s buffer does not move when the `Vec` does.
        let ptr = NonNull::new(v.as_mut_ptr()).unwrap_or(NonNull::dangling());
        Ok(Self {
            _owner: Inner::Heap(v),
            ptr,
            lines,
        })
    }

    #[inline(always)]
    pub(crate) fn lines(&self) -> &[Line] {
        // SAFETY: `ptr` points to `lines` initialised, aligned lines owned
        // by `_owner` (or is dangling with `lines == 0`), which live as long
        // as `self`; `&self` excludes any `&mut` to them.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.lines) }
    }

    #[inline(always)]
    pub(crate) fn lines_mut(&mut self) -> &mut [Line] {
        // SAFETY: as in `lines`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.lines) }
    }

    /// The lines as 256-bit blocks (two per line).
    #[inline(always)]
    pub(crate) fn blocks256(&self) -> &[[u64; 4]] {
        // SAFETY: as in `lines`: `lines` 64-byte lines are 2·`lines` arrays
        // of four u64 (align 8 ≤ 64, no padding), owned by `_owner`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().cast(), self.lines * 2) }
    }

    /// The lines as mutable 256-bit blocks.
    #[inline(always)]
    pub(crate) fn blocks256_mut(&mut self) -> &mut [[u64; 4]] {
        // SAFETY: as in `blocks256`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().cast(), self.lines * 2) }
    }

    pub(crate) const fn len(&self) -> usize {
        self.lines
    }
}

/// A 64-byte line of atomic words (the concurrent filter's storage unit).
#[derive(Debug, Default)]
#[repr(C, align(64))]
pub(crate) struct AtomicLine(pub(crate) [AtomicU64; 8]);

/// Zeroed lines that are only ever accessed atomically: a [`Storage`]
/// (so large filters get huge pages too) that hands out its lines as
/// [`AtomicLine`]s and never as plain words.
#[derive(Debug)]
pub(crate) struct AtomicStorage(Storage);

impl AtomicStorage {
    /// `lines` zeroed atomic lines.
    pub(crate) fn zeroed(lines: usize) -> Result<Self> {
        Storage::zeroed(lines).map(Self)
    }

    #[inline(always)]
    pub(crate) fn lines(&self) -> &[AtomicLine] {
        // SAFETY: as in `Storage::lines`, the memory is `len` initialised
        // lines owned by the inner storage, which live as long as `self`.
        // `AtomicU64` has the size, alignment (8) and bit validity of
        // `u64`, so an `AtomicLine` has `Line`'s layout (64 bytes, align
        // 64). The pointer came from a unique borrow of the allocation, so
        // it may write through the atomics' interior mutability; and this
        // wrapper never hands out the plain lines, so no non-atomic access
        // ever races an atomic one.
        unsafe { std::slice::from_raw_parts(self.0.ptr.as_ptr().cast(), self.0.lines) }
    }
}

impl Clone for Storage {
    fn clone(&self) -> Self {
        let mut copy = Self::zeroed(self.lines)
            .unwrap_or_else(|_| unreachable!("the original has the same size"));
        copy.lines_mut().copy_from_slice(self.lines());
        copy
    }
}

impl PartialEq for Storage {
    fn eq(&self, other: &Self) -> bool {
        self.lines() == other.lines()
    }
}
