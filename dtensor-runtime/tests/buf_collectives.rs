//! The collectives of `Communicator` on host buffers (`Buf::Host`/`BufMut::Host`/
//! `BufInOut::Host`, through the blanket impl of `HostCollectives`) against the thread
//! backend's host kernels (`HostCollectives`). (Moved from a unit test of `comm/buf.rs`,
//! unchanged, so that `comm/buf.rs` does not import the thread backend: issue 32, no import
//! cycle through `comm/pending.rs`; issue 32 item 2a made the `*_buf` family the one family of
//! `Communicator`, so the comparison is now against the host kernels it replaced.)

use dtensor_runtime::comm::{Buf, BufInOut, BufMut};
use dtensor_runtime::{Communicator, DType, Error, HostCollectives, ReduceOp, Result, ThreadWorld};

/// The host arms of the buffer collectives give what the host kernels give, on the thread
/// backend (uneven values, 3 ranks).
#[test]
fn host_buffers_match_the_host_collectives() {
    let world = ThreadWorld::new(3, std::time::Duration::from_secs(30));
    let rank = |r: usize| -> Result<Vec<f32>> {
        let c = world.communicator(r)?;
        let g = [0usize, 1, 2];
        let me = r as f32;
        let xs: Vec<f32> = (0..6).map(|i| me * 10.0 + i as f32 * 0.5).collect();
        let send: &[u8] = bytemuck::cast_slice(&xs);
        let f32s = |b: &[u8]| bytemuck::pod_collect_to_vec::<u8, f32>(b);

        let mut a = vec![0u8; 3 * send.len()];
        Communicator::all_gather(&c, &g, Buf::Host(send), BufMut::from(&mut a))?;
        let mut b = vec![0u8; 3 * send.len()];
        HostCollectives::all_gather(&c, &g, send, (&mut b).into())?;
        assert_eq!(a, b, "all_gather");

        let mut a = vec![0u8; send.len()];
        Communicator::all_reduce_into(&c, &g, Buf::Host(send), BufMut::from(&mut a), DType::F32, ReduceOp::Sum)?;
        let mut b = send.to_vec();
        HostCollectives::all_reduce(&c, &g, &mut b, DType::F32, ReduceOp::Sum)?;
        assert_eq!(f32s(&a), f32s(&b), "all_reduce");
        let mut a = send.to_vec();
        Communicator::all_reduce(&c, &g, BufInOut::Host(&mut a), DType::F32, ReduceOp::Sum)?;
        assert_eq!(f32s(&a), f32s(&b), "all_reduce in place");

        let mut a = vec![0u8; send.len() / 3];
        Communicator::reduce_scatter(&c, &g, Buf::Host(send), BufMut::from(&mut a), DType::F32, ReduceOp::Max)?;
        let mut b = vec![0u8; send.len() / 3];
        HostCollectives::reduce_scatter(&c, &g, send, (&mut b).into(), DType::F32, ReduceOp::Max)?;
        assert_eq!(f32s(&a), f32s(&b), "reduce_scatter");

        let mut a = vec![0u8; send.len()];
        Communicator::all_to_all(&c, &g, Buf::Host(send), BufMut::from(&mut a))?;
        let mut b = vec![0u8; send.len()];
        HostCollectives::all_to_all(&c, &g, send, (&mut b).into())?;
        assert_eq!(a, b, "all_to_all");

        let mut a = send.to_vec();
        Communicator::broadcast(&c, &g, BufInOut::Host(&mut a), 2)?;
        let mut b = send.to_vec();
        HostCollectives::broadcast(&c, &g, &mut b, 2)?;
        assert_eq!(a, b, "broadcast");

        // A receive buffer of the wrong length is a typed error, never a panic.
        let mut short = vec![0u8; 3];
        let e =
            Communicator::all_reduce_into(&c, &g, Buf::Host(send), BufMut::from(&mut short), DType::F32, ReduceOp::Sum)
                .unwrap_err();
        assert!(matches!(e, Error::BufferMismatch { .. }), "{e:?}");
        Ok(f32s(&a))
    };
    let out: Vec<Vec<f32>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..3).map(|r| s.spawn(move || rank(r))).collect();
        ranks.into_iter().map(|h| h.join().unwrap().unwrap()).collect()
    });
    let root: Vec<f32> = (0..6).map(|i| 20.0 + i as f32 * 0.5).collect();
    assert!(out.iter().all(|v| *v == root));
}
