//! Typed stack, index_select, gather, repeat_interleave (GQA) and repeat on a 2×2 mesh,
//! against the single-rank result.
use dtensor::ndarray::{ArrayD, Axis, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{Dt, Replicate, Shard};

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let g = ArrayD::from_shape_fn(IxDyn(&[4, 6]), |ix| (ix[0] * 6 + ix[1]) as f32);
        let x: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::distribute(&g, &mesh)?;
        // stack: the row shard moves to dim 1.
        let s: Dt<f32, _, (Shard<1>, Replicate), 3> = Dt::stack(&[&x, &x], Dim::<0>)?;
        // index_select of columns 5 and 0 keeps the rows sharded.
        let ids: Dt<f32, _, (Replicate, Replicate), 1> =
            Dt::distribute(&ArrayD::from_shape_vec(IxDyn(&[2]), vec![5.0, 0.0]).unwrap(), &mesh)?;
        let sel: Dt<f32, _, (Shard<0>, Replicate), 2> = x.index_select(Dim::<1>, &ids)?;
        // gather along dim 1 with an index sharded like the rows.
        let gi = ArrayD::from_shape_fn(IxDyn(&[4, 1]), |ix| ix[0] as f32);
        let idx: Dt<f32, _, (Shard<0>, Replicate), 2> = Dt::distribute(&gi, &mesh)?;
        let gat: Dt<f32, _, (Shard<0>, Replicate), 2> = x.gather(Dim::<1>, &idx)?;
        // GQA: 2 kv heads sharded on tp, repeated to 4 heads, still sharded.
        let kv_g = ArrayD::from_shape_fn(IxDyn(&[2, 2, 3]), |ix| (ix[0] * 10 + ix[1]) as f32);
        let kv: Dt<f32, (dp, tp), (Shard<0>, Shard<1>), 3> = Dt::distribute(&kv_g, &mesh)?;
        let heads: Dt<f32, _, (Shard<0>, Shard<1>), 3> = kv.repeat_interleave(2, Dim::<1>)?;
        let tiled: Dt<f32, _, (Shard<0>, Replicate), 2> = x.repeat([1, 2])?;
        let s_full = s.full_tensor()?;
        let h = heads.full_tensor()?;
        let ok = s_full.shape() == [2, 4, 6]
            && s_full.index_axis(Axis(0), 1).to_owned() == g
            && sel.full_tensor()?.index_axis(Axis(1), 0).to_owned() == g.index_axis(Axis(1), 5).to_owned()
            && gat.full_tensor()?.iter().copied().collect::<Vec<_>>() == vec![0.0, 7.0, 14.0, 21.0]
            && h.shape() == [2, 4, 3]
            && (0..4).map(|i| h[&[1, i, 0][..]]).collect::<Vec<_>>() == vec![10.0, 10.0, 11.0, 11.0]
            && tiled.full_tensor()?.shape() == [4, 12];
        Ok(ok)
    })
    .unwrap();
    assert!(out.into_iter().all(|ok| ok));
}
