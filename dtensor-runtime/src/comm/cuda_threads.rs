//! `cuda-threads`: ranks as threads of one process whose shards live on CUDA devices (several
//! ranks may share one GPU), exchanging data through the thread backend's rendezvous.
//!
//! The communicator is the rank's [`ThreadComm`] plus its [`CudaDevice`] handle (own context
//! binding and stream): a mesh over it places every DTensor on that device.
//!
//! Collectives on device buffers ([`Buf::Cuda`]) move the data device to device: all ranks are
//! threads of one process, so a device address is valid on every rank (one primary context
//! per GPU). Each member synchronizes its stream (its send data is complete) and publishes its
//! send buffer's address and length in a rendezvous of the inner thread backend
//! (`ThreadComm::rendezvous`, under the collective's own tag), then enqueues on its *own*
//! stream copies out of its peers' buffers into its receive buffer; all-reduce and
//! reduce-scatter copy the members' blocks one at a time into a one-block device scratch and
//! fold them into the output with the element-wise device kernels in group order (so every
//! member gets the same bits, those of the host fold in the same order; `Avg` sums, then
//! divides by the group size, as the host reduce does). It then synchronizes its stream; the
//! rendezvous releases no member before every member has, so no send buffer is freed while a
//! peer still reads it. A peer that fails surfaces as the thread backend's `PeerFailed` or
//! `CollectiveTimeout`. Groups of one copy locally without a rendezvous.
//!
//! This is the default; `DTENSOR_CUDA_THREADS_STAGE=host` at launch (see [`STAGE_ENV`](crate::env::STAGE_ENV)) stages
//! every collective through the host instead. Both paths passed the GPU check on an H200
//! (the redistribution property test, the collectives on device buffers against the host, `mlp_tp` on a
//! 2x2 mesh), on one GPU. Always staged through the host: host buffers (the inner collectives
//! directly), reductions of the integers (no device `binary` kernel for them), and groups
//! whose members are on different GPUs (copies between devices would need peer access to
//! each other's memory pools; the members publish their device ordinals in the rendezvous and
//! all fall back alike). The path depends only on the call, the launch and those published
//! records, so every member takes the same.

use super::buf::{Buf, BufInOut, BufMut, Reduce};
use super::threads::ThreadComm;
use super::{fingerprint, Communicator};
use crate::cuda::CudaDevice;
use crate::device::Device;
use crate::element::DType;
use crate::error::Result;
use crate::placement::ReduceOp;
use std::sync::Arc;

/// Whether [`STAGE_ENV`](crate::env::STAGE_ENV) leaves the device-to-device path on (each rank reads it when created;
/// a value [`cuda_threads_stage_host`](crate::env::cuda_threads_stage_host) rejects is reported once on stderr and leaves it on).
pub fn device_path_from_env() -> bool {
    !crate::env::cuda_threads_stage_host().unwrap_or_else(|e| {
        crate::env::warn_once(crate::env::STAGE_ENV, &e);
        false
    })
}

/// A thread-backend rank whose shards live on `device` (see the [module docs](self)).
#[derive(Debug)]
pub struct CudaThreadsComm {
    inner: ThreadComm,
    device: Arc<CudaDevice>,
    /// [`STAGE_ENV`](crate::env::STAGE_ENV) asked for the host-staged path when the rank was created.
    stage_host: bool,
}

impl CudaThreadsComm {
    /// The rank of `inner` with its shards on `device` (open one handle per rank: each owns
    /// its stream). Reads [`STAGE_ENV`](crate::env::STAGE_ENV) once, here.
    pub fn new(inner: ThreadComm, device: Arc<CudaDevice>) -> Self {
        let stage_host = !device_path_from_env();
        CudaThreadsComm { inner, device, stage_host }
    }

    /// Whether the device path is off (see [`STAGE_ENV`](crate::env::STAGE_ENV)).
    pub fn stages_through_host(&self) -> bool {
        self.stage_host
    }

    /// All-reduce / reduce-scatter: device to device when the dtype has the device fold kernel
    /// (see the [module docs](self)), else the inner thread backend's (staged through the host).
    // Without the `cuda` feature `recv` is never borrowed mutably.
    #[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
    fn reduce(
        &self,
        kind: Reduce,
        group: &[usize],
        send: Buf<'_>,
        mut recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, r)) = self.on_device(&send, &mut recv).filter(|_| d2d::reduces(dtype)) {
            if self.d2d_reduce(kind, group, s, r, dtype, op)? {
                return Ok(());
            }
        }
        match kind {
            Reduce::All => Communicator::all_reduce_into(&self.inner, group, send, recv, dtype, op),
            Reduce::Scatter => Communicator::reduce_scatter(&self.inner, group, send, recv, dtype, op),
        }
    }
}

// Without the `cuda` feature the collectives never borrow `recv` mutably.
#[cfg_attr(not(feature = "cuda"), allow(unused_mut))]
// SAFETY: host buffers, and device buffers the device path does not take, go to the inner
// thread communicator, which upholds the contract; the device path writes every byte of the
// receive buffer before returning `Ok`.
unsafe impl Communicator for CudaThreadsComm {
    fn rank(&self) -> usize {
        Communicator::rank(&self.inner)
    }
    fn world_size(&self) -> usize {
        Communicator::world_size(&self.inner)
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
        Communicator::sequences(&self.inner)
    }
    fn all_gather(&self, group: &[usize], send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, r)) = self.on_device(&send, &mut recv) {
            if self.d2d_all_gather(group, s, r)? {
                return Ok(());
            }
        }
        Communicator::all_gather(&self.inner, group, send, recv)
    }
    fn all_reduce(&self, group: &[usize], mut buf: BufInOut<'_>, dtype: DType, op: ReduceOp) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(r) = self.in_out_on_device(&mut buf).filter(|_| d2d::reduces(dtype)) {
            // Peers read our input while we overwrite it: they read a copy.
            let copy = self.snapshot(r)?;
            if self.d2d_reduce(Reduce::All, group, &self.bytes(&copy), r, dtype, op)? {
                return Ok(());
            }
        }
        Communicator::all_reduce(&self.inner, group, buf, dtype, op)
    }
    fn all_reduce_into(
        &self,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce(Reduce::All, group, send, recv, dtype, op)
    }
    fn reduce_scatter(
        &self,
        group: &[usize],
        send: Buf<'_>,
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        self.reduce(Reduce::Scatter, group, send, recv, dtype, op)
    }
    fn all_to_all(&self, group: &[usize], send: Buf<'_>, mut recv: BufMut<'_>) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some((s, r)) = self.on_device(&send, &mut recv) {
            if self.d2d_all_to_all(group, s, r)? {
                return Ok(());
            }
        }
        Communicator::all_to_all(&self.inner, group, send, recv)
    }
    fn all_to_all_strided(
        &self,
        group: &[usize],
        send: Buf<'_>,
        rows: usize,
        run: usize,
        recv: BufMut<'_>,
    ) -> Result<()> {
        Communicator::all_to_all_strided(&self.inner, group, send, rows, run, recv)
    }
    fn all_gather_v(&self, group: &[usize], send: Buf<'_>, counts: &[usize], recv: BufMut<'_>) -> Result<()> {
        Communicator::all_gather_v(&self.inner, group, send, counts, recv)
    }
    fn reduce_scatter_v(
        &self,
        group: &[usize],
        send: Buf<'_>,
        counts: &[usize],
        recv: BufMut<'_>,
        dtype: DType,
        op: ReduceOp,
    ) -> Result<()> {
        Communicator::reduce_scatter_v(&self.inner, group, send, counts, recv, dtype, op)
    }
    fn all_to_all_v(
        &self,
        group: &[usize],
        send: Buf<'_>,
        rows: usize,
        runs: &[usize],
        recv: BufMut<'_>,
        recv_counts: &[usize],
    ) -> Result<()> {
        Communicator::all_to_all_v(&self.inner, group, send, rows, runs, recv, recv_counts)
    }
    fn broadcast(&self, group: &[usize], mut buf: BufInOut<'_>, root: usize) -> Result<()> {
        #[cfg(feature = "cuda")]
        if let Some(r) = self.in_out_on_device(&mut buf) {
            // The root's buffer is read by its peers while each overwrites its own: they read
            // a copy (as the out-of-place device broadcast into a fresh buffer did).
            let copy = self.snapshot(r)?;
            if self.d2d_broadcast(group, &self.bytes(&copy), r, root)? {
                return Ok(());
            }
        }
        Communicator::broadcast(&self.inner, group, buf, root)
    }
    fn scatter(&self, group: &[usize], send: Buf<'_>, recv: BufMut<'_>, root: usize) -> Result<()> {
        Communicator::scatter(&self.inner, group, send, recv, root)
    }
    fn barrier(&self, group: &[usize]) -> Result<()> {
        Communicator::barrier(&self.inner, group)
    }
}

/// The device-to-device collectives (see the [module docs](self)).
#[cfg(feature = "cuda")]
mod d2d {
    use super::CudaThreadsComm;
    use crate::comm::buf::{Buf, BufInOut, BufMut, CudaBytes, CudaBytesMut, Reduce};
    use crate::comm::check::Args;
    use crate::comm::threads::Bufs;
    use crate::comm::{check, group, reduce, Communicator};
    use crate::cuda::counters::{count, Work};
    use crate::cuda::cuda_err;
    use crate::element::DType;
    use crate::error::Result;
    use crate::op::BinaryOp;
    use crate::placement::ReduceOp;
    use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};

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

    /// `n` as one element of float `dtype` (the divisor of `Avg`), rounded as the host's
    /// `from_usize` rounds it (exact in f32/f64; bf16 is exact up to 256, f16 up to 2048).
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

        /// The buffer of an in-place collective on this rank's device with the device path on,
        /// or `None`: then the collective is staged through the host.
        pub(super) fn in_out_on_device<'s, 'b>(&self, buf: &'s mut BufInOut<'b>) -> Option<&'s mut CudaBytesMut<'b>> {
            if self.stage_host {
                return None;
            }
            crate::comm::buf::in_out_on(&self.device, buf)
        }

        /// A device copy of `b` on this rank's stream: what peers read in an in-place
        /// collective while this rank overwrites `b`.
        pub(super) fn snapshot(&self, b: &CudaBytesMut<'_>) -> Result<CudaSlice<u8>> {
            count(Work::DeviceToDevice);
            self.device.stream().clone_dtod(&b.view).map_err(|e| cuda_err("device to device copy", e))
        }

        /// `copy` as a collective's input.
        pub(super) fn bytes<'a>(&'a self, copy: &'a CudaSlice<u8>) -> CudaBytes<'a> {
            CudaBytes { view: copy.as_view(), device: &self.device }
        }

        /// Publishes `send` to the group through the inner thread backend's rendezvous (under
        /// the `op`'s own tag: a member in another collective, host or device, fails the tag
        /// check), runs `copy` with every member's send address and this member's index once
        /// all have published and agree on the length, then waits for this rank's stream. The
        /// rendezvous lets no member leave before every member's `copy` and stream wait have
        /// returned, even after an error or a timeout, so that no send buffer is released while
        /// a peer's stream still reads it; for the same reason the stream wait runs whether or
        /// not `copy` failed. `copy` must only enqueue work on this rank's stream.
        ///
        /// Members on different GPUs copy nothing and all return `Ok(false)` (every member sees
        /// the same published device ordinals, so all decide alike): the caller then stages the
        /// collective through the host, since copies between GPUs would need peer access to the
        /// other device's memory pool. A group of one runs `copy` with this member alone,
        /// without a rendezvous.
        fn exchange(
            &self,
            op: &'static str,
            group: &[usize],
            send: &CudaBytes<'_>,
            args: Args,
            copy: impl FnOnce(&[u64], usize) -> Result<()>,
        ) -> Result<bool> {
            let me = group::index_of(op, self.rank(), group)?;
            let stream = self.device.stream();
            let (sp, _read) = send.view.device_ptr(stream);
            if group.len() == 1 {
                return copy(&[sp], 0).map(|()| true);
            }
            // Peers read `send` from their own streams: it must be complete first.
            self.device.synchronize()?;
            let ordinal = self.device.ordinal();
            // The element type, reduction and root travel as `args`: the rendezvous fails every
            // member alike when they differ.
            let mine = Bufs {
                send: sp as usize,
                send_len: send.len(),
                extra: ordinal,
                args: args.packed(),
                ..Bufs::default()
            };
            self.inner.rendezvous(op, group, mine, |all, _| {
                if let Some(i) = all.iter().position(|b| b.send_len != send.len()) {
                    let why = format!(
                        "rank {} sends {} bytes, rank {} {}",
                        group[i],
                        all[i].send_len,
                        self.rank(),
                        send.len()
                    );
                    return Err(check::mismatch(op, why));
                }
                if all.iter().any(|b| b.extra != ordinal) {
                    return Ok(false);
                }
                let peers: Vec<u64> = all.iter().map(|b| b.send as u64).collect();
                let copied = copy(&peers, me);
                let synced = self.device.synchronize();
                copied.and(synced).map(|()| true)
            })
        }

        pub(super) fn d2d_all_gather(
            &self,
            group: &[usize],
            s: &CudaBytes<'_>,
            r: &mut CudaBytesMut<'_>,
        ) -> Result<bool> {
            check::blocks("all_gather", "recv", r.len(), group.len(), s.len())?;
            let l = s.len();
            let dev = &self.device;
            self.exchange("all_gather_buf", group, s, Args::default(), |peers, _| {
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
        ) -> Result<bool> {
            check::all_to_all(s.len(), r.len(), group.len())?;
            let l = s.len() / group.len();
            let dev = &self.device;
            self.exchange("all_to_all_buf", group, s, Args::default(), |peers, me| {
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
        ) -> Result<bool> {
            check::root(root, group.len())?;
            check::same_len("broadcast", s.len(), r.len())?;
            let (dev, l) = (&self.device, r.len());
            self.exchange("broadcast_buf", group, s, Args::root(root), |peers, _| {
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
        ) -> Result<bool> {
            let (name, n, b) = match kind {
                Reduce::All => ("all_reduce_buf", group.len(), r.len()),
                Reduce::Scatter => ("reduce_scatter_buf", group.len(), r.len()),
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
                return self.exchange(name, group, s, Args::reduce(dtype, op), |peers, _| {
                    let (rp, _write) = r.view.device_ptr_mut(stream);
                    // SAFETY: b bytes of this member's send into recv (b bytes).
                    unsafe { dev.copy_raw(rp, peers[0], b) }
                });
            }
            // One block of scratch whatever the group size: member j's block is copied into it
            // and folded into `recv` before member j + 1's (one stream orders the reuse).
            // SAFETY: every byte is written by a copy below before a kernel reads it.
            let mut scratch = unsafe { stream.alloc::<u8>(b) }.map_err(|e| cuda_err("device allocation", e))?;
            let div = match op {
                ReduceOp::Avg => {
                    let d = divisor(dtype, n);
                    count(Work::HostToDevice(d.len()));
                    Some(stream.clone_htod(&d).map_err(|e| cuda_err("host to device copy", e))?)
                }
                _ => None,
            };
            let (count, f) = (b / dtype.size_of(), fold_op(op));
            self.exchange(name, group, s, Args::reduce(dtype, op), |peers, me| {
                let (sc, _s) = scratch.device_ptr_mut(stream);
                let (rp, _write) = r.view.device_ptr_mut(stream);
                let block = if kind == Reduce::Scatter { me * b } else { 0 } as u64;
                // SAFETY (copies and kernels): the scratch and recv hold b bytes = `count`
                // elements; member j's send holds this member's block at `block` (lengths
                // checked); all stay alive until the stream is synchronized. The fold is
                // ((m0 op m1) op m2) ..., the host's order.
                unsafe {
                    dev.copy_raw(rp, peers[0] + block, b)?;
                    for &p in &peers[1..] {
                        dev.copy_raw(sc, p + block, b)?;
                        crate::storage::cuda::binary_raw(dev, dtype, f, rp, sc, rp, count, false)?;
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
