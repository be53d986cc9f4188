//! Collective buffers that may live on a device: [`Buf`] (read), [`BufMut`] (written) and
//! [`BufInOut`] (read, then written in place: all-reduce and broadcast), each host bytes or a
//! view into the rank's CUDA memory.
//!
//! Every collective of [`Communicator`](super::Communicator) takes them. A host receive
//! buffer is a [`RecvBuf`], which may be uninitialised memory (the mesh hands backends the
//! spare capacity of a fresh `Vec` rather than zero-filling it first). Backends without a
//! device path implement [`HostCollectives`](super::HostCollectives) on host bytes, and
//! [`staged`] moves device buffers through the host around those kernels (copy in, run the
//! host collective, copy out on the rank's stream): the one place device data is staged. NCCL
//! and `cuda-threads` run device buffers on the device directly and stage only what their
//! device path cannot take. Without the `cuda` feature the `Cuda` arms hold an uninhabited
//! type, so the API is the same in every build and the arm is statically unreachable.

use super::RecvBuf;
use crate::error::Result;

#[cfg(not(feature = "cuda"))]
pub use absent::{CudaBytes, CudaBytesMut};
#[cfg(feature = "cuda")]
pub use device::{CudaBytes, CudaBytesMut};

/// A collective's input: host bytes or device bytes.
#[derive(Debug)]
pub enum Buf<'a> {
    /// Host memory.
    Host(&'a [u8]),
    /// Device memory of the rank's CUDA device.
    Cuda(CudaBytes<'a>),
}

/// A collective's output: host bytes (possibly uninitialised until the collective writes
/// them) or device bytes; every byte is written on `Ok`.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// Host memory, possibly uninitialised ([`RecvBuf`]).
    Host(RecvBuf<'a>),
    /// Device memory of the rank's CUDA device.
    Cuda(CudaBytesMut<'a>),
}

/// The buffer of an in-place collective (all-reduce, broadcast): initialised bytes that the
/// collective reads and overwrites, on the host or the device.
#[derive(Debug)]
pub enum BufInOut<'a> {
    /// Host memory.
    Host(&'a mut [u8]),
    /// Device memory of the rank's CUDA device.
    Cuda(CudaBytesMut<'a>),
}

impl<'a> From<&'a [u8]> for Buf<'a> {
    fn from(b: &'a [u8]) -> Self {
        Buf::Host(b)
    }
}

impl<'a> From<&'a Vec<u8>> for Buf<'a> {
    fn from(b: &'a Vec<u8>) -> Self {
        Buf::Host(b)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for Buf<'a> {
    fn from(b: &'a [u8; N]) -> Self {
        Buf::Host(b)
    }
}

impl<'a> From<RecvBuf<'a>> for BufMut<'a> {
    fn from(b: RecvBuf<'a>) -> Self {
        BufMut::Host(b)
    }
}

impl<'a> From<&'a mut [u8]> for BufMut<'a> {
    fn from(b: &'a mut [u8]) -> Self {
        BufMut::Host(b.into())
    }
}

impl<'a> From<&'a mut Vec<u8>> for BufMut<'a> {
    fn from(b: &'a mut Vec<u8>) -> Self {
        BufMut::Host(b.into())
    }
}

impl<'a, const N: usize> From<&'a mut [u8; N]> for BufMut<'a> {
    fn from(b: &'a mut [u8; N]) -> Self {
        BufMut::Host(b.into())
    }
}

impl<'a> From<&'a mut [u8]> for BufInOut<'a> {
    fn from(b: &'a mut [u8]) -> Self {
        BufInOut::Host(b)
    }
}

impl<'a> From<&'a mut Vec<u8>> for BufInOut<'a> {
    fn from(b: &'a mut Vec<u8>) -> Self {
        BufInOut::Host(b)
    }
}

impl<'a, const N: usize> From<&'a mut [u8; N]> for BufInOut<'a> {
    fn from(b: &'a mut [u8; N]) -> Self {
        BufInOut::Host(b)
    }
}

impl Buf<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Buf::Host(b) => b.len(),
            Buf::Cuda(d) => d.len(),
        }
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes on the host: borrowed, or copied from the device.
    pub fn to_host(&self) -> Result<std::borrow::Cow<'_, [u8]>> {
        match self {
            Buf::Host(b) => Ok(std::borrow::Cow::Borrowed(b)),
            Buf::Cuda(d) => d.to_host().map(std::borrow::Cow::Owned),
        }
    }
}

impl BufMut<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            BufMut::Host(b) => b.len(),
            BufMut::Cuda(d) => d.len(),
        }
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Runs the host collective `run` on a host receive buffer of this length, then copies its
    /// bytes here (directly when this buffer is on the host: `run` then writes into it, still
    /// uninitialised).
    pub fn stage(&mut self, run: impl FnOnce(RecvBuf<'_>) -> Result<()>) -> Result<()> {
        match self {
            BufMut::Host(b) => run(b.reborrow()),
            BufMut::Cuda(d) => {
                let mut host = vec![0u8; d.len()];
                run((&mut host).into())?;
                d.copy_from_host(&host)
            }
        }
    }
}

impl BufInOut<'_> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            BufInOut::Host(b) => b.len(),
            BufInOut::Cuda(d) => d.len(),
        }
    }
    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Runs the in-place host collective `run` on these bytes (copied to the host and back
    /// when they are on the device).
    pub fn stage(&mut self, run: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<()> {
        match self {
            BufInOut::Host(b) => run(b),
            BufInOut::Cuda(d) => {
                let mut host = d.to_host()?;
                run(&mut host)?;
                d.copy_from_host(&host)
            }
        }
    }
}

/// Both buffers on the device of handle `device` (the same handle, so its stream orders work
/// on them), or `None`: the test of the backends with a device path (NCCL, `cuda-threads`).
#[cfg(feature = "cuda")]
pub(crate) fn both_on<'s, 'a, 'b>(
    device: &std::sync::Arc<crate::cuda::CudaDevice>,
    send: &'s Buf<'a>,
    recv: &'s mut BufMut<'b>,
) -> Option<(&'s CudaBytes<'a>, &'s mut CudaBytesMut<'b>)> {
    use std::sync::Arc;
    match (send, recv) {
        (Buf::Cuda(s), BufMut::Cuda(r)) if Arc::ptr_eq(s.device, device) && Arc::ptr_eq(r.device, device) => {
            Some((s, r))
        }
        _ => None,
    }
}

/// The buffer of an in-place collective on the device of handle `device`, or `None`.
#[cfg(feature = "cuda")]
pub(crate) fn in_out_on<'s, 'b>(
    device: &std::sync::Arc<crate::cuda::CudaDevice>,
    buf: &'s mut BufInOut<'b>,
) -> Option<&'s mut CudaBytesMut<'b>> {
    match buf {
        BufInOut::Cuda(b) if std::sync::Arc::ptr_eq(b.device, device) => Some(b),
        _ => None,
    }
}

/// The two reductions of the collectives on buffers, for backends that run them through one
/// code path.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Reduce {
    /// All-reduce: every member gets the whole reduction.
    All,
    /// Reduce-scatter: member `i` gets block `i` of it.
    Scatter,
}

impl Reduce {
    /// The collective's name in errors.
    #[cfg(feature = "cuda")]
    pub(crate) fn op(self) -> &'static str {
        match self {
            Reduce::All => "all_reduce",
            Reduce::Scatter => "reduce_scatter",
        }
    }
}

/// Device data staged through the host around a host kernel: the only place a collective
/// copies device buffers to the host and back. The blanket
/// [`Communicator`](super::Communicator) impl of every
/// [`HostCollectives`](super::HostCollectives) backend runs each collective through these, and
/// NCCL and `cuda-threads` call them for the buffers their device path cannot take. A host
/// buffer passes straight through (a host receive buffer stays uninitialised for the kernel).
pub mod staged {
    use super::{Buf, BufInOut, BufMut};
    use crate::comm::RecvBuf;
    use crate::error::Result;

    /// A collective from `send` into `recv`: `kernel` runs on host bytes.
    pub fn send_recv(
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        kernel: impl FnOnce(&[u8], RecvBuf<'_>) -> Result<()>,
    ) -> Result<()> {
        let send = send.to_host()?;
        recv.stage(|r| kernel(&send, r))
    }

    /// An in-place collective on `buf`: `kernel` runs on host bytes.
    pub fn in_place(mut buf: BufInOut<'_>, kernel: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<()> {
        buf.stage(kernel)
    }

    /// A collective from `send` into an initialised host receive buffer (scatter): `kernel`
    /// runs on host bytes, its receive buffer zero-filled first.
    pub fn send_recv_init(
        send: Buf<'_>,
        recv: BufMut<'_>,
        kernel: impl FnOnce(&[u8], &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        send_recv(send, recv, |s, mut r| kernel(s, r.zeroed()))
    }
}

#[cfg(feature = "cuda")]
mod device {
    use super::{Buf, BufInOut, BufMut};
    use crate::cuda::counters::{count, Work};
    use crate::cuda::{cuda_err, CudaDevice};
    use crate::element::Scalar;
    use crate::error::Result;
    use crate::storage::CudaStorage;
    use cudarc::driver::{CudaView, CudaViewMut};
    use std::fmt;
    use std::sync::Arc;

    impl<'a> Buf<'a> {
        /// A device shard as a collective's input: its bytes ([`Buf::Host`] of nothing when
        /// empty, since an empty shard holds no allocation).
        pub fn of_cuda<T: Scalar>(s: &'a CudaStorage<T>) -> Buf<'a> {
            match s.device_bytes() {
                (Some(view), device) => Buf::Cuda(CudaBytes { view, device }),
                (None, _) => Buf::Host(&[]),
            }
        }
    }

    impl<'a> BufMut<'a> {
        /// A device shard as a collective's output (copied first when shared): its bytes, or
        /// [`BufMut::Host`] of nothing when empty.
        pub fn of_cuda<T: Scalar>(s: &'a mut CudaStorage<T>) -> Result<BufMut<'a>> {
            Ok(match s.device_bytes_mut()? {
                (Some(view), device) => BufMut::Cuda(CudaBytesMut { view, device }),
                (None, _) => BufMut::Host((&mut [][..]).into()),
            })
        }
    }

    impl<'a> BufInOut<'a> {
        /// A device shard as an in-place collective's buffer (copied first when shared): its
        /// bytes, or [`BufInOut::Host`] of nothing when empty.
        pub fn of_cuda<T: Scalar>(s: &'a mut CudaStorage<T>) -> Result<BufInOut<'a>> {
            Ok(match s.device_bytes_mut()? {
                (Some(view), device) => BufInOut::Cuda(CudaBytesMut { view, device }),
                (None, _) => BufInOut::Host(&mut []),
            })
        }
    }

    /// Bytes of device memory and the device handle whose stream orders work on them.
    pub struct CudaBytes<'a> {
        /// The bytes.
        pub view: CudaView<'a, u8>,
        /// The rank's device (its stream orders the copies).
        pub device: &'a Arc<CudaDevice>,
    }

    /// Writable bytes of device memory and the device handle whose stream orders work on them.
    pub struct CudaBytesMut<'a> {
        /// The bytes.
        pub view: CudaViewMut<'a, u8>,
        /// The rank's device (its stream orders the copies).
        pub device: &'a Arc<CudaDevice>,
    }

    impl fmt::Debug for CudaBytes<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "CudaBytes({} B on {:?})", self.view.len(), self.device)
        }
    }

    impl fmt::Debug for CudaBytesMut<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "CudaBytesMut({} B on {:?})", self.view.len(), self.device)
        }
    }

    impl CudaBytes<'_> {
        /// Length in bytes.
        pub fn len(&self) -> usize {
            self.view.len()
        }
        /// Whether it holds no bytes.
        pub fn is_empty(&self) -> bool {
            self.view.len() == 0
        }
        /// Copied to the host (a device-to-pageable copy returns once it is complete).
        pub fn to_host(&self) -> Result<Vec<u8>> {
            let mut out = vec![0u8; self.view.len()];
            count(Work::DeviceToHost(out.len()));
            self.device.stream().memcpy_dtoh(&self.view, &mut out).map_err(|e| cuda_err("staging device bytes", e))?;
            Ok(out)
        }
    }

    impl CudaBytesMut<'_> {
        /// Length in bytes.
        pub fn len(&self) -> usize {
            self.view.len()
        }
        /// Whether it holds no bytes.
        pub fn is_empty(&self) -> bool {
            self.view.len() == 0
        }
        /// Copied to the host (a device-to-pageable copy returns once it is complete).
        pub fn to_host(&self) -> Result<Vec<u8>> {
            let mut out = vec![0u8; self.view.len()];
            count(Work::DeviceToHost(out.len()));
            self.device.stream().memcpy_dtoh(&self.view, &mut out).map_err(|e| cuda_err("staging device bytes", e))?;
            Ok(out)
        }
        /// Overwritten with `host` (same length, checked by the caller).
        pub fn copy_from_host(&mut self, host: &[u8]) -> Result<()> {
            crate::comm::check::same_len("staging", host.len(), self.view.len())?;
            count(Work::HostToDevice(host.len()));
            self.device.stream().memcpy_htod(host, &mut self.view).map_err(|e| cuda_err("copying to the device", e))
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod absent {
    use crate::error::Result;
    use std::convert::Infallible;
    use std::marker::PhantomData;

    /// Device bytes; the `cuda` feature is off, so none exist.
    #[derive(Debug)]
    pub struct CudaBytes<'a> {
        never: Infallible,
        _borrow: PhantomData<&'a [u8]>,
    }

    /// Writable device bytes; the `cuda` feature is off, so none exist.
    #[derive(Debug)]
    pub struct CudaBytesMut<'a> {
        never: Infallible,
        _borrow: PhantomData<&'a mut [u8]>,
    }

    impl CudaBytes<'_> {
        /// Length in bytes.
        pub fn len(&self) -> usize {
            match self.never {}
        }
        /// Whether it holds no bytes.
        pub fn is_empty(&self) -> bool {
            match self.never {}
        }
        /// Copied to the host.
        pub fn to_host(&self) -> Result<Vec<u8>> {
            match self.never {}
        }
    }

    impl CudaBytesMut<'_> {
        /// Length in bytes.
        pub fn len(&self) -> usize {
            match self.never {}
        }
        /// Whether it holds no bytes.
        pub fn is_empty(&self) -> bool {
            match self.never {}
        }
        /// Copied to the host.
        pub fn to_host(&self) -> Result<Vec<u8>> {
            match self.never {}
        }
        /// Overwritten with `host`.
        pub fn copy_from_host(&mut self, _host: &[u8]) -> Result<()> {
            match self.never {}
        }
    }
}
