//! Integer tensors through the typed layer's comparisons, selection, shape ops and indexing:
//! every result on the 2×2 mesh (5 rows over dp = 2 and 3 columns over tp = 2, uneven as
//! torch.chunk) equals 1 rank's, and the ops whose layouts allow it issue no collective.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::op::BinaryOp;
use dtensor::typed::dims::{dp, tp};
use dtensor::typed::Dim;
use dtensor::{CommDebugMode, Dt, Replicate, Shard};

type X = Dt<i64, (dp, tp), (Shard<0>, Shard<1>), 2>;
type Rows = Dt<i64, (dp, tp), (Shard<0>, Replicate), 2>;

fn ops(n: usize, mesh_shape: &[usize]) -> Vec<Vec<ArrayD<i64>>> {
    dtensor::run(n, |ctx| {
        let mesh = ctx.init_device_mesh(mesh_shape, &["dp", "tp"])?;
        // Values beyond 2^40 (exact only as integers), ties at every third element.
        let g = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| (1i64 << 40) * (ix[0] as i64 - 2) + ix[1] as i64);
        let h = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| {
            if (ix[0] + ix[1]) % 3 == 0 { g[[ix[0], ix[1]]] } else { 7 * ix[0] as i64 - 5 }
        });
        let x: X = Dt::distribute(&g, &mesh)?;
        let y: X = Dt::distribute(&h, &mesh)?;
        let mode = CommDebugMode::new();
        let (lt, ge, picked, filled, t, back) = mode.scope(|| -> dtensor::Result<_> {
            let lt: X = x.lt_mask(&y)?;
            let ge: Dt<u8, (dp, tp), (Shard<0>, Shard<1>), 2> = x.compare_mask(BinaryOp::Ge, &y)?;
            let picked: X = x.where_(&ge, &y)?;
            let filled: X = x.masked_fill(&ge, -1)?;
            let t: Dt<i64, (dp, tp), (Shard<1>, Shard<0>), 2> = x.t()?;
            let u: Dt<i64, (dp, tp), (Shard<1>, Shard<2>), 3> = x.unsqueeze(Dim::<0>)?;
            let back: X = u.squeeze(Dim::<0>)?;
            Ok((lt, ge, picked, filled, t, back))
        })?;
        assert_eq!(mode.total(), 0, "comparisons, selection and views of shards are local");
        let mut out = vec![lt.full_tensor()?, ge.cast::<i64>()?.full_tensor()?, picked.full_tensor()?];
        out.extend([filled.full_tensor()?, t.full_tensor()?, back.full_tensor()?]);
        let rows: Rows = x.redistribute()?;
        let ids: Dt<i64, (dp, tp), (Replicate, Replicate), 1> =
            Dt::distribute(&ArrayD::from_shape_vec(IxDyn(&[3]), vec![2, 0, 2]).unwrap(), &mesh)?;
        let cols: Rows = rows.index_select(Dim::<1>, &ids)?;
        let wide: Rows = Dt::cat(&[&rows, &cols], Dim::<1>)?;
        let part: Rows = wide.narrow(Dim::<1>, 1, 4)?;
        let tiled: Rows = part.repeat([1, 2])?;
        out.extend([cols.full_tensor()?, wide.full_tensor()?, tiled.full_tensor()?]);
        Ok(out)
    })
    .unwrap()
}

fn main() {
    let one = ops(1, &[1, 1]).remove(0);
    for got in ops(4, &[2, 2]) {
        assert_eq!(got, one);
    }
}
