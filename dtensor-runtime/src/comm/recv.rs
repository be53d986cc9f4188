//! [`RecvBuf`]: the receive buffer of a collective, which need not be initialised.
//!
//! A collective overwrites every byte of its receive buffer, so the mesh hands backends the
//! spare capacity of a fresh `Vec` instead of zero-filling it first (a whole extra pass over
//! the output at the sizes where bandwidth matters). The type only ever writes initialised
//! bytes, so an initialised `&mut [u8]` can be passed as one safely.

use std::mem::MaybeUninit;

/// Bytes a collective writes into, possibly uninitialised until it does.
///
/// Build one from an initialised buffer (`(&mut buf).into()`, for a `Vec<u8>`, an array or a
/// slice) or from spare capacity ([`RecvBuf::uninit`]). Nothing can de-initialise a byte
/// through it, so an initialised buffer stays initialised.
///
/// ```
/// use dtensor_runtime::comm::RecvBuf;
/// let mut buf = vec![0u8; 4];
/// let mut r = RecvBuf::from(&mut buf);
/// r.write(1, &[7, 8]);
/// assert_eq!(buf, [0, 7, 8, 0]);
/// ```
#[derive(Debug)]
pub struct RecvBuf<'a> {
    bytes: &'a mut [MaybeUninit<u8>],
}

impl<'a> RecvBuf<'a> {
    /// Possibly uninitialised bytes, e.g. `&mut vec.spare_capacity_mut()[..n]`.
    pub fn uninit(bytes: &'a mut [MaybeUninit<u8>]) -> Self {
        RecvBuf { bytes }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// A shorter-lived handle on the same bytes (to pass on).
    pub fn reborrow(&mut self) -> RecvBuf<'_> {
        RecvBuf { bytes: self.bytes }
    }

    /// Copies `src` to bytes `at..at + src.len()`.
    ///
    /// # Panics
    /// When the range is outside the buffer (callers check lengths first).
    pub fn write(&mut self, at: usize, src: &[u8]) {
        self.bytes[at..at + src.len()].write_copy_of_slice(src);
    }

    /// Copies `src` (as long as the buffer) into the whole buffer and returns it, initialised.
    ///
    /// # Panics
    /// When the lengths differ (callers check lengths first).
    pub fn init_from(&mut self, src: &[u8]) -> &mut [u8] {
        self.bytes.write_copy_of_slice(src)
    }

    /// Zero-fills the whole buffer and returns it, initialised: for backends whose transport
    /// only writes into initialised memory.
    pub fn zeroed(&mut self) -> &mut [u8] {
        self.bytes.fill(MaybeUninit::new(0));
        // SAFETY: every byte was just written.
        unsafe { &mut *(std::ptr::from_mut::<[MaybeUninit<u8>]>(self.bytes) as *mut [u8]) }
    }

    /// The first byte, for a backend that writes disjoint ranges from several places.
    /// Writers must only store initialised bytes through it.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut MaybeUninit<u8> {
        self.bytes.as_mut_ptr()
    }
}

impl<'a> From<&'a mut [u8]> for RecvBuf<'a> {
    fn from(b: &'a mut [u8]) -> Self {
        // SAFETY: same layout; `RecvBuf` writes only initialised bytes, so `b` stays valid.
        RecvBuf { bytes: unsafe { &mut *(std::ptr::from_mut::<[u8]>(b) as *mut [MaybeUninit<u8>]) } }
    }
}

impl<'a> From<&'a mut Vec<u8>> for RecvBuf<'a> {
    fn from(b: &'a mut Vec<u8>) -> Self {
        b.as_mut_slice().into()
    }
}

impl<'a, const N: usize> From<&'a mut [u8; N]> for RecvBuf<'a> {
    fn from(b: &'a mut [u8; N]) -> Self {
        b.as_mut_slice().into()
    }
}

/// A fresh buffer of `len` elements that `fill` writes completely through a [`RecvBuf`] over
/// its bytes; the elements are not zero-filled first.
///
/// # Safety
/// On `Ok`, `fill` must have written every byte of the `RecvBuf` it was given (what
/// [`Communicator`](super::Communicator) implementations promise for their receive buffers).
pub(crate) unsafe fn filled<T: bytemuck::Pod>(
    context: &str,
    len: usize,
    fill: impl FnOnce(RecvBuf<'_>) -> crate::error::Result<()>,
) -> crate::error::Result<Vec<T>> {
    let mut out: Vec<T> = crate::alloc::try_with_capacity(context, len)?;
    let spare = &mut out.spare_capacity_mut()[..len];
    let bytes = std::mem::size_of_val(spare);
    // SAFETY: `MaybeUninit<u8>` has no validity requirement and alignment 1; the byte view
    // covers exactly the `len` spare elements.
    let view = unsafe { std::slice::from_raw_parts_mut(spare.as_mut_ptr().cast::<MaybeUninit<u8>>(), bytes) };
    fill(RecvBuf::uninit(view))?;
    // SAFETY: the caller's contract: every byte was written, and any bytes are a valid `T`
    // (`Pod`).
    unsafe { out.set_len(len) };
    Ok(out)
}
