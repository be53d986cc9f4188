//! Collective buffers that may live on a device: [`Buf`] (read) and [`BufMut`] (written), each
//! host bytes or a view into the rank's CUDA memory.
//!
//! The `*_buf` collectives of [`Communicator`](super::Communicator) take them. Their default
//! implementations (threads, MPI) stage device data through the host: copy in, run the host
//! collective, copy out on the rank's stream. NCCL and `cuda-threads` override them to run on
//! device buffers directly. Without the `cuda` feature the `Cuda` arms hold an uninhabited type, so the API
//! is the same in every build and the arm is statically unreachable.

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

/// A collective's output: host bytes or device bytes, every byte written on `Ok`.
#[derive(Debug)]
pub enum BufMut<'a> {
    /// Host memory.
    Host(&'a mut [u8]),
    /// Device memory of the rank's CUDA device.
    Cuda(CudaBytesMut<'a>),
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
    /// Runs the host collective `run` on a host buffer of this length, then copies its bytes
    /// here (directly when this buffer is on the host).
    pub fn stage(&mut self, run: impl FnOnce(&mut [u8]) -> Result<()>) -> Result<()> {
        match self {
            BufMut::Host(b) => run(b),
            BufMut::Cuda(d) => {
                let mut host = vec![0u8; d.len()];
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

/// The two reductions of the `*_buf` collectives, for backends that run them through one
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

/// The default `*_buf` collectives: device data staged through the host around the host
/// collective (every backend without a device path; NCCL for buffers it cannot take directly).
pub mod staged {
    use super::{Buf, BufMut};
    use crate::comm::check;
    use crate::comm::Communicator;
    use crate::element::DType;
    use crate::error::Result;
    use crate::placement::ReduceOp;

    /// [`Communicator::all_gather_buf`] through the host.
    pub fn all_gather<C: Communicator + ?Sized>(
        c: &C,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
    ) -> Result<()> {
        let send = send.to_host()?;
        recv.stage(|r| c.all_gather(group, &send, r.into()))
    }

    /// [`Communicator::all_reduce_buf`] through the host.
    pub fn all_reduce<C: Communicator + ?Sized>(
        c: &C,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let send = send.to_host()?;
        recv.stage(|r| c.all_reduce_into(group, &send, r.into(), dtype, op))
    }

    /// [`all_reduce`] or [`reduce_scatter`], as `kind` says.
    pub(crate) fn reduce<C: Communicator + ?Sized>(
        c: &C,
        kind: super::Reduce,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        match kind {
            super::Reduce::All => all_reduce(c, group, send, recv, dtype, op),
            super::Reduce::Scatter => reduce_scatter(c, group, send, recv, dtype, op),
        }
    }

    /// [`Communicator::reduce_scatter_buf`] through the host.
    pub fn reduce_scatter<C: Communicator + ?Sized>(
        c: &C,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        let send = send.to_host()?;
        recv.stage(|r| c.reduce_scatter(group, &send, r.into(), dtype, op))
    }

    /// [`Communicator::all_to_all_buf`] through the host.
    pub fn all_to_all<C: Communicator + ?Sized>(
        c: &C,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
    ) -> Result<()> {
        let send = send.to_host()?;
        recv.stage(|r| c.all_to_all(group, &send, r.into()))
    }

    /// [`Communicator::broadcast_buf`] through the host.
    pub fn broadcast<C: Communicator + ?Sized>(
        c: &C,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        root: usize,
    ) -> Result<()> {
        check::same_len("broadcast", send.len(), recv.len())?;
        let send = send.to_host()?;
        recv.stage(|r| {
            r.copy_from_slice(&send);
            c.broadcast(group, r, root)
        })
    }
}

#[cfg(feature = "cuda")]
mod device {
    use super::{Buf, BufMut};
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
                (None, _) => BufMut::Host(&mut []),
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
        /// Overwritten with `host` (same length, checked by the caller).
        pub fn copy_from_host(&mut self, host: &[u8]) -> Result<()> {
            crate::comm::check::same_len("staging", host.len(), self.view.len())?;
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
        /// Overwritten with `host`.
        pub fn copy_from_host(&mut self, _host: &[u8]) -> Result<()> {
            match self.never {}
        }
    }
}
