//! `cuda-threads`: ranks as threads of one process whose shards live on CUDA devices (several
//! ranks may share one GPU), exchanging data through the thread backend's rendezvous.
//!
//! The communicator is the rank's [`ThreadComm`] plus its [`CudaDevice`] handle (own context
//! binding and stream): a mesh over it places every DTensor on that device.
//!
//! Collectives on device buffers ([`Buf::Cuda`]) move the data device to device: all ranks are
//! threads of one process, so a device address is valid on every rank (one primary context
//! per GPU; across GPUs unified addressing makes the copies peer copies). Each member
//! synchronizes its stream (its send data is complete), publishes its send buffer's address
//! and length through the inner thread backend (an all-gather of a small host record), then
//! enqueues on its *own* stream copies out of its peers' buffers into its receive buffer;
//! all-reduce and reduce-scatter copy the members' blocks into a device scratch and fold them
//! with the element-wise device kernels in group order (so every member gets the same bits,
//! those of the host fold in the same order; `Avg` sums, then divides by the group size, as
//! the host reduce does). It then synchronizes its stream and meets the others in an inner
//! barrier, so no send buffer is released while a peer still reads it. A peer that fails
//! surfaces as the thread backend's `PeerFailed` or `CollectiveTimeout`. Groups of one copy
//! locally without a rendezvous.
//!
//! The device path is opt-in (`DTENSOR_CUDA_THREADS_STAGE=device` at launch, see [`STAGE_ENV`])
//! until the GPU check has run it on a GPU: the host-staged path is the one that has (the
//! redistribution property test, `mlp_tp` on a 2x2 mesh). Always staged through the host: host
//! buffers (the inner collectives directly) and reductions of the integers (no device `binary`
//! kernel for them). The path depends only on the call and the launch, so every member takes
//! the same.

use super::buf::{self, Buf, BufMut};
use super::threads::ThreadComm;
use super::{fingerprint, Communicator, RecvBuf};
use crate::cuda::CudaDevice;
use crate::element::DType;
use crate::error::Result;
use crate::placement::ReduceOp;
use crate::storage::Device;
use std::sync::Arc;

/// The environment variable that picks the path of collectives on device buffers: `device`
/// moves them device to device; anything else, or unset, stages them through the host.
pub const STAGE_ENV: &str = "DTENSOR_CUDA_THREADS_STAGE";

/// Whether [`STAGE_ENV`] asks for the device-to-device path (each rank reads it when created).
pub fn device_path_from_env() -> bool {
    std::env::var(STAGE_ENV).is_ok_and(|v| v == "device")
}

/// A thread-backend rank whose shards live on `device` (see the [module docs](self)).
#[derive(Debug)]
pub struct CudaThreadsComm {
    inner: ThreadComm,
    device: Arc<CudaDevice>,
    /// [`STAGE_ENV`] did not ask for the device path when the rank was created.
    stage_host: bool,
}

impl CudaThreadsComm {
    /// The rank of `inner` with its shards on `device` (open one handle per rank: each owns
    /// its stream). Reads [`STAGE_ENV`] once, here.
    pub fn new(inner: ThreadComm, device: Arc<CudaDevice>) -> Self {
        let stage_host = !device_path_from_env();
        CudaThreadsComm { inner, device, stage_host }
    }

    /// Whether the device path is off (the default; see [`STAGE_ENV`]).
    pub fn stages_through_host(&self) -> bool {
        self.stage_host
    }
}

// Without the `cuda` feature the `*_buf` overrides never borrow `recv` mutably.
#[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
// SAFETY: the host collectives are the inner thread communicator's, which upholds the
// contract; the device ones write every byte of the receive buffer before returning `Ok`.
unsafe impl Communicator for CudaThreadsComm {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn backend(&self) -> &'static str {
        "cuda-threads"
    }
    fn device(&self) -> Device {
        Device::Cuda(self.device.ordinal())
    }
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        Some(Arc::clone(&self.device))
    }
    fn sequences(&self) -> Option<&fingerprint::Sequences> {
        self.inner.sequences()
    }
    fn all_gather(&self, group: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<()> {
        self.inner.all_gather(group, send, recv)
    }
    fn all_reduce(&self, group: &[usize], buf: &mut [u8], dtype: DType, op: ReduceOp) -> Result<()> {
        self.inner.all_reduce(group, buf, dtype, op)
    }
    fn all_reduce_into(
        &self,
        group: &[usize],
        send: &[u8],
        recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.inner.all_reduce_into(group, send, recv, dtype, op)
    }
    fn reduce_scatter(
        &self,
        group: &[usize],
        send: &[u8],
        recv: RecvBuf<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.inner.reduce_scatter(group, send, recv, dtype, op)
    }
    fn all_to_all(&self, group: &[usize], send: &[u8], recv: RecvBuf<'_>) -> Result<()> {
        self.inner.all_to_all(group, send, recv)
    }
    fn all_to_all_strided(
        &self,
        group: &[usize],
        send: &[u8],
        rows: usize,
        run: usize,
        recv: RecvBuf<'_>,
    ) -> Result<()> {
        self.inner.all_to_all_strided(group, send, rows, run, recv)
    }
    fn broadcast(&self, group: &[usize], buf: &mut [u8], root: usize) -> Result<()> {
        self.inner.broadcast(group, buf, root)
    }
    fn scatter(&self, group: &[usize], send: &[u8], recv: &mut [u8], root: usize) -> Result<()> {
        self.inner.scatter(group, send, recv, root)
    }
    fn barrier(&self, group: &[usize]) -> Result<()> {
        self.inner.barrier(group)
    }

    fn all_gather_buf(&self, group: &[usize], send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, r)) = self.on_device(&send, &mut recv) {
            return self.d2d_all_gather(group, s, r);
        }
        buf::staged::all_gather(self, group, send, recv)
    }
    fn all_reduce_buf(
        &self,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, r)) = self.on_device(&send, &mut recv).filter(|_| d2d::reduces(dtype)) {
            return self.d2d_reduce(d2d::Reduce::All, group, s, r, dtype, op);
        }
        buf::staged::all_reduce(self, group, send, recv, dtype, op)
    }
    fn reduce_scatter_buf(
        &self,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, r)) = self.on_device(&send, &mut recv).filter(|_| d2d::reduces(dtype)) {
            return self.d2d_reduce(d2d::Reduce::Scatter, group, s, r, dtype, op);
        }
        buf::staged::reduce_scatter(self, group, send, recv, dtype, op)
    }
    fn all_to_all_buf(&self, group: &[usize], send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, r)) = self.on_device(&send, &mut recv) {
            return self.d2d_all_to_all(group, s, r);
        }
        buf::staged::all_to_all(self, group, send, recv)
    }
    fn broadcast_buf(&self, group: &[usize], send: Buf<'_>, mut recv: BufMut<'_>, root: usize) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, r)) = self.on_device(&send, &mut recv) {
            return self.d2d_broadcast(group, s, r, root);
        }
        buf::staged::broadcast(self, group, send, recv, root)
    }
}

/// The device-to-device collectives (see the [module docs](self)).
#[cfg(feature = "cuda")]
mod d2d {
    use super::CudaThreadsComm;
    use crate::comm::buf::{Buf, BufMut, CudaBytes, CudaBytesMut};
    use crate::comm::{check, group, reduce, Communicator};
    use crate::cuda::cuda_err;
    use crate::element::DType;
    use crate::error::Result;
    use crate::placement::ReduceOp;
    use crate::storage::op::BinaryOp;
    use cudarc::driver::{DevicePtr, DevicePtrMut};

    /// The two reductions.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub(super) enum Reduce {
        All,
        Scatter,
    }

    /// The collectives as the code a member publishes with its buffer, so that a member in
    /// another collective fails the check instead of being read as this one's input.
    const OPS: [&str; 5] = ["all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast"];

    /// Bytes of a published record: send address, send length, op code (native-endian u64s).
    const RECORD: usize = 24;

    /// Whether `dtype` reduces on the device (it has the element-wise `binary` kernel).
    pub(super) fn reduces(dtype: DType) -> bool {
        crate::cuda::source::has_kernel("binary", dtype.name())
    }

    /// The element-wise op that folds `op`'s operands (`Avg` sums, then divides).
    fn fold_op(op: ReduceOp) -> BinaryOp {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => BinaryOp::Add,
            ReduceOp::Max => BinaryOp::Maximum,
            ReduceOp::Min => BinaryOp::Minimum,
            ReduceOp::Product => BinaryOp::Mul,
        }
    }

    /// `n` as one element of float `dtype` (the divisor of `Avg`, converted as the host's
    /// `from_usize` does: exactly, for any group size).
    fn divisor(dtype: DType, n: usize) -> Vec<u8> {
        match dtype {
            DType::F64 => (n as f64).to_ne_bytes().to_vec(),
            DType::BF16 => half::bf16::from_f64(n as f64).to_ne_bytes().to_vec(),
            DType::F16 => half::f16::from_f64(n as f64).to_ne_bytes().to_vec(),
            _ => (n as f32).to_ne_bytes().to_vec(),
        }
    }

    impl CudaThreadsComm {
        /// Both buffers on this rank's device (the same handle, so its stream orders them) and
        /// the device path on, or `None`: then the collective is staged through the host.
        pub(super) fn on_device<'s, 'a, 'b>(
            &self,
            send: &'s Buf<'a>,
            recv: &'s mut BufMut<'b>,
        ) -> Option<(&'s CudaBytes<'a>, &'s mut CudaBytesMut<'b>)> {
            if self.stage_host {
                return None;
            }
            crate::comm::buf::both_on(&self.device, send, recv)
        }

        /// Publishes `send` to the group, runs `copy` with every member's send address and this
        /// member's index once all have published, waits for this rank's stream, then for every
        /// member. The final barrier runs even after an error of this member, so that its send
        /// buffer outlives every peer's reads of it; `copy` must only enqueue work on this
        /// rank's stream.
        ///
        /// A group of one runs `copy` with this member alone, without a rendezvous.
        fn exchange(
            &self,
            op: &'static str,
            group: &[usize],
            send: &CudaBytes<'_>,
            copy: impl FnOnce(&[u64], usize) -> Result<()>,
        ) -> Result<()> {
            let me = group::index_of(op, self.rank(), group)?;
            let stream = self.device.stream();
            let (sp, _read) = send.view.device_ptr(stream);
            if group.len() == 1 {
                return copy(&[sp], 0);
            }
            // Peers read `send` from their own streams: it must be complete first.
            self.device.synchronize()?;
            let code = OPS.iter().position(|&o| o == op).map_or(0, |i| i as u64 + 1);
            let mut mine = [0u8; RECORD];
            for (k, v) in [sp, send.len() as u64, code].into_iter().enumerate() {
                mine[8 * k..8 * k + 8].copy_from_slice(&v.to_ne_bytes());
            }
            let mut all = vec![0u8; RECORD * group.len()];
            self.inner.all_gather(group, &mine, (&mut all).into())?;
            let field = |i: usize, k: usize| {
                let at = i * RECORD + 8 * k;
                u64::from_ne_bytes(all[at..at + 8].try_into().unwrap_or_default())
            };
            let work = (|| {
                for (i, &peer) in group.iter().enumerate() {
                    let (len, theirs) = (field(i, 1), field(i, 2));
                    let why = if theirs != code {
                        let other = OPS.get((theirs as usize).wrapping_sub(1)).copied().unwrap_or("?");
                        format!("rank {peer} called `{other}` while rank {} called `{op}`", self.rank())
                    } else if len != send.len() as u64 {
                        format!("rank {peer} sends {len} bytes, rank {} {}", self.rank(), send.len())
                    } else {
                        continue;
                    };
                    return Err(check::mismatch(op, why));
                }
                let peers: Vec<u64> = (0..group.len()).map(|i| field(i, 0)).collect();
                copy(&peers, me)?;
                self.device.synchronize()
            })();
            let done = self.inner.barrier(group);
            work?;
            done
        }

        pub(super) fn d2d_all_gather(
            &self,
            group: &[usize],
            s: &CudaBytes<'_>,
            r: &mut CudaBytesMut<'_>,
        ) -> Result<()> {
            check::blocks("all_gather", "recv", r.len(), group.len(), s.len())?;
            let l = s.len();
            let dev = &self.device;
            self.exchange("all_gather", group, s, |peers, _| {
                let (rp, _write) = r.view.device_ptr_mut(dev.stream());
                for (j, &p) in peers.iter().enumerate() {
                    // SAFETY: member j's send (l bytes, checked) into block j of recv (n * l).
                    unsafe { dev.copy_raw(rp + (j * l) as u64, p, l) }?;
                }
                Ok(())
            })
        }

        pub(super) fn d2d_all_to_all(
            &self,
            group: &[usize],
            s: &CudaBytes<'_>,
            r: &mut CudaBytesMut<'_>,
        ) -> Result<()> {
            check::all_to_all(s.len(), r.len(), group.len())?;
            let l = s.len() / group.len();
            let dev = &self.device;
            self.exchange("all_to_all", group, s, |peers, me| {
                let (rp, _write) = r.view.device_ptr_mut(dev.stream());
                for (j, &p) in peers.iter().enumerate() {
                    // SAFETY: block `me` of member j's send (n * l bytes, checked) into block j
                    // of recv (as long).
                    unsafe { dev.copy_raw(rp + (j * l) as u64, p + (me * l) as u64, l) }?;
                }
                Ok(())
            })
        }

        pub(super) fn d2d_broadcast(
            &self,
            group: &[usize],
            s: &CudaBytes<'_>,
            r: &mut CudaBytesMut<'_>,
            root: usize,
        ) -> Result<()> {
            check::root(root, group.len())?;
            check::same_len("broadcast", s.len(), r.len())?;
            let (dev, l) = (&self.device, r.len());
            self.exchange("broadcast", group, s, |peers, _| {
                let (rp, _write) = r.view.device_ptr_mut(dev.stream());
                // SAFETY: the root's send, as long as recv (checked).
                unsafe { dev.copy_raw(rp, peers[root], l) }
            })
        }

        /// All-reduce (`recv` as long as `send`) or reduce-scatter (`send` = `n` blocks of
        /// `recv`'s length, member `i` reducing block `i`): the members' blocks copied into a
        /// device scratch, folded in group order into `recv`.
        pub(super) fn d2d_reduce(
            &self,
            kind: Reduce,
            group: &[usize],
            s: &CudaBytes<'_>,
            r: &mut CudaBytesMut<'_>,
            dtype: DType,
            op: ReduceOp,
        ) -> Result<()> {
            let (name, n, b) = match kind {
                Reduce::All => ("all_reduce", group.len(), r.len()),
                Reduce::Scatter => ("reduce_scatter", group.len(), r.len()),
            };
            reduce::check_op(dtype, op)?;
            match kind {
                Reduce::All => check::same_len(name, s.len(), r.len())?,
                Reduce::Scatter => check::blocks(name, "send", s.len(), n, r.len())?,
            }
            check::whole(name, b, dtype)?;
            let dev = &self.device;
            let stream = dev.stream();
            if n == 1 || b == 0 {
                // One member: its input is the result (`Avg` divides by 1, exactly).
                return self.exchange(name, group, s, |peers, _| {
                    let (rp, _write) = r.view.device_ptr_mut(stream);
                    // SAFETY: b bytes of this member's send into recv (b bytes).
                    unsafe { dev.copy_raw(rp, peers[0], b) }
                });
            }
            // SAFETY: every byte is written by the copies below before the kernels read it.
            let mut scratch = unsafe { stream.alloc::<u8>(n * b) }.map_err(|e| cuda_err("device allocation", e))?;
            let div = match op {
                ReduceOp::Avg => {
                    Some(stream.clone_htod(&divisor(dtype, n)).map_err(|e| cuda_err("host to device copy", e))?)
                }
                _ => None,
            };
            let (count, f) = (b / dtype.size_of(), fold_op(op));
            self.exchange(name, group, s, |peers, me| {
                let (sc, _s) = scratch.device_ptr_mut(stream);
                let (rp, _write) = r.view.device_ptr_mut(stream);
                let at = |j: usize| sc + (j * b) as u64;
                let block = if kind == Reduce::Scatter { me * b } else { 0 };
                // SAFETY (copies and kernels): the scratch holds n blocks of b bytes; member j's
                // send holds this member's block at `block` (lengths checked); recv holds b
                // bytes = `count` elements; all stay alive until the stream is synchronized.
                unsafe {
                    for (j, &p) in peers.iter().enumerate() {
                        dev.copy_raw(at(j), p + block as u64, b)?;
                    }
                    crate::storage::cuda::binary_raw(dev, dtype, f, at(0), at(1), rp, count, false)?;
                    for j in 2..n {
                        crate::storage::cuda::binary_raw(dev, dtype, f, rp, at(j), rp, count, false)?;
                    }
                    if let Some(div) = &div {
                        let (dp, _d) = div.device_ptr(stream);
                        crate::storage::cuda::binary_raw(dev, dtype, BinaryOp::Div, rp, dp, rp, count, true)?;
                    }
                }
                Ok(())
            })
        }
    }
}
