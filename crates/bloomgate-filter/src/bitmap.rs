//! A bitmap over 64-bit words, stored in 64-byte aligned cache lines.

use crate::error::{Error, Result};
use crate::storage::{Line, Storage};

/// A fixed-length array of bits.
///
/// Storage is rounded up to whole 64-byte lines and aligned to 64 bytes (on
/// huge pages when it is 2 MiB or more), so a
/// block of a blocked filter never straddles two cache lines. The padding
/// bits past [`Bitmap::len`] are always zero: the checked methods refuse
/// positions there.
///
/// ```
/// use bloomgate_filter::Bitmap;
/// let mut b = Bitmap::new(100).unwrap();
/// assert_eq!(b.set(42).unwrap(), false); // was clear
/// assert!(b.test(42).unwrap());
/// assert_eq!(b.count_ones(), 1);
/// assert!(b.set(100).is_err()); // out of range, never wraps
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Bitmap {
    lines: Storage,
    len: u64,
}

impl Bitmap {
    /// A bitmap of `len` bits, all clear.
    ///
    /// # Errors
    /// [`Error::TooLarge`] when the bitmap would not fit in memory.
    pub fn new(len: u64) -> Result<Self> {
        let bytes = crate::sizing::check_fits(u128::from(len))?;
        Ok(Self {
            lines: Storage::zeroed(bytes / 64)?,
            len,
        })
    }

    /// Rebuilds a bitmap from its words (as returned by [`Bitmap::words`]).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] when the word count does not match `len`
    /// rounded up to whole lines, or a padding bit past `len` is set.
    pub fn from_words(len: u64, words: &[u64]) -> Result<Self> {
        let mut b = Self::new(len)?;
        if words.len() != b.words().len() {
            return Err(Error::InvalidParameter {
                name: "words",
                reason: format!(
                    "{} words given, a {len}-bit bitmap has {}",
                    words.len(),
                    b.words().len()
                ),
            });
        }
        b.words_mut().copy_from_slice(words);
        b.check_padding()
    }

    /// Returns the bitmap if no bit past its length is set.
    pub(crate) fn check_padding(self) -> Result<Self> {
        if self.padding_dirty() {
            return Err(Error::InvalidParameter {
                name: "words",
                reason: "bits past the bitmap's length are set".into(),
            });
        }
        Ok(self)
    }

    fn padding_dirty(&self) -> bool {
        let full = (self.len / 64) as usize;
        let words = self.words();
        let partial = self.len % 64;
        if partial != 0 && words[full] >> partial != 0 {
            return true;
        }
        let start = full + usize::from(partial != 0);
        words[start..].iter().any(|&w| w != 0)
    }

    /// Length in bits.
    #[must_use]
    pub const fn len(&self) -> u64 {
        self.len
    }

    /// True for a zero-length bitmap.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, pos: u64) -> Result<()> {
        if pos < self.len {
            Ok(())
        } else {
            Err(Error::OutOfRange { pos, len: self.len })
        }
    }

    /// Sets bit `pos`; returns its previous value.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when `pos >= len`.
    pub fn set(&mut self, pos: u64) -> Result<bool> {
        self.check(pos)?;
        Ok(self.set_unchecked(pos))
    }

    /// Clears bit `pos`; returns its previous value.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when `pos >= len`.
    pub fn reset(&mut self, pos: u64) -> Result<bool> {
        self.check(pos)?;
        let (w, mask) = Self::locate(pos);
        let word = &mut self.words_mut()[w];
        let was = *word & mask != 0;
        *word &= !mask;
        Ok(was)
    }

    /// Reads bit `pos`.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] when `pos >= len`.
    pub fn test(&self, pos: u64) -> Result<bool> {
        self.check(pos)?;
        Ok(self.test_unchecked(pos))
    }

    #[inline]
    const fn locate(pos: u64) -> (usize, u64) {
        ((pos / 64) as usize, 1u64 << (pos % 64))
    }

    /// Sets a bit the caller knows is in range; returns its previous value.
    #[inline]
    pub(crate) fn set_unchecked(&mut self, pos: u64) -> bool {
        debug_assert!(pos < self.len);
        let (w, mask) = Self::locate(pos);
        let word = &mut self.words_mut()[w];
        let was = *word & mask != 0;
        *word |= mask;
        was
    }

    #[inline]
    pub(crate) fn test_unchecked(&self, pos: u64) -> bool {
        debug_assert!(pos < self.len);
        let (w, mask) = Self::locate(pos);
        self.words()[w] & mask != 0
    }

    /// Number of set bits (population count).
    #[must_use]
    pub fn count_ones(&self) -> u64 {
        self.words().iter().map(|w| u64::from(w.count_ones())).sum()
    }

    /// True when at least one bit is set.
    #[must_use]
    pub fn any(&self) -> bool {
        self.words().iter().any(|&w| w != 0)
    }

    /// True when no bit is set.
    #[must_use]
    pub fn none(&self) -> bool {
        !self.any()
    }

    /// Clears every bit.
    pub fn clear(&mut self) {
        self.lines.lines_mut().fill(Line([0; 8]));
    }

    /// The raw words, little-endian bit order within each word, padded to a
    /// whole number of 64-byte lines. Padding bits are zero.
    #[must_use]
    #[inline(always)]
    pub fn words(&self) -> &[u64] {
        bytemuck::cast_slice(self.lines.lines())
    }

    #[inline(always)]
    pub(crate) fn words_mut(&mut self) -> &mut [u64] {
        bytemuck::cast_slice_mut(self.lines.lines_mut())
    }

    /// The storage as 256-bit blocks.
    #[inline(always)]
    pub(crate) fn blocks256(&self) -> &[[u64; 4]] {
        self.lines.blocks256()
    }

    /// The storage as 512-bit blocks (whole lines).
    #[inline(always)]
    pub(crate) fn lines(&self) -> &[Line] {
        self.lines.lines()
    }

    /// The storage as mutable 512-bit blocks (whole lines).
    #[inline(always)]
    pub(crate) fn lines_mut(&mut self) -> &mut [Line] {
        self.lines.lines_mut()
    }

    /// The storage as mutable 256-bit blocks.
    #[inline(always)]
    pub(crate) fn blocks256_mut(&mut self) -> &mut [[u64; 4]] {
        self.lines.blocks256_mut()
    }

    /// ORs `other` into `self`.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the lengths differ.
    pub fn union_with(&mut self, other: &Self) -> Result<()> {
        if self.len != other.len {
            return Err(Error::ShapeMismatch(format!(
                "bitmap lengths {} and {}",
                self.len, other.len
            )));
        }
        for (a, b) in self.words_mut().iter_mut().zip(other.words()) {
            *a |= b;
        }
        Ok(())
    }

    /// Bytes of bit storage (whole lines).
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.lines.len() * 64
    }
}
