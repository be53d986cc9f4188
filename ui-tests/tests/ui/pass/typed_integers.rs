//! Integer tensors in the typed layer and `#[distribute]`: `Dt<i64, ..>` / `Dt<i32, ..>` /
//! `Dt<u8, ..>` distribute, redistribute, gather and cast; typed `i64` ids feed `embedding` and
//! typed `i32` targets feed `cross_entropy`. Every value on the 2×2 mesh equals 1 rank's.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, DTensor, Dt, Partial, Replicate, Result, Shard, Sum};

type Ids = Dt<i64, (dp, tp), (Shard<0>, Replicate), 2>;

/// Token ids sharded over `dp`, a table sharded over `tp` on the embedding dim.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate], returns = [Replicate, Replicate])]
fn embed(
    ids: &DTensor<i64>,
    #[placements(Replicate, Shard(1))] table: &DTensor<f32>,
) -> Result<DTensor<f32, 3>> {
    let y: Dt<f32, (dp, tp), (Shard<0>, Shard<2>), 3> = table.embedding(ids)?;
    y.redistribute()
}

/// Integer targets against class-sharded logits (loss parallel): a Partial sum over `tp`.
#[distribute(mesh = "dp,tp", placements = [Replicate, Shard(1)], returns = [Replicate, Replicate])]
fn loss(logits: &DTensor<f32>, #[placements(Replicate, Replicate)] target: &DTensor<i32, 1>) -> Result<DTensor<f32, 0>> {
    let l: Dt<f32, (dp, tp), (Replicate, Partial<Sum>), 0> = logits.cross_entropy_loss_parallel(target)?;
    l.redistribute()
}

/// Moves of an integer tensor and casts to the other integer types and to f64.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Shard(1)], returns = [Replicate, Replicate])]
fn gather_ids(ids: DTensor<i64>) -> Result<DTensor<i64>> {
    let by_rows: Dt<i64, (dp, tp), (Shard<1>, Replicate), 2> = ids.redistribute()?;
    let narrow: Dt<i32, (dp, tp), (Shard<1>, Replicate), 2> = by_rows.cast()?;
    let bytes: Dt<u8, (dp, tp), (Replicate, Replicate), 2> = narrow.redistribute::<(Replicate, Replicate)>()?.cast()?;
    let back: Dt<i64, _, _, 2> = bytes.cast()?;
    assert_eq!(back.shape(), by_rows.shape());
    by_rows.redistribute()
}

#[allow(clippy::type_complexity)]
fn pipeline(n: usize, mesh_shape: &[usize]) -> Vec<(ArrayD<i64>, ArrayD<f32>, ArrayD<f32>, ArrayD<i64>)> {
    dtensor::run(n, |ctx| {
        let mesh = ctx.init_device_mesh(mesh_shape, &["dp", "tp"])?;
        // 5 rows over dp = 2: uneven shards (3 + 2), as torch.chunk.
        let gids = ArrayD::from_shape_fn(IxDyn(&[5, 3]), |ix| ((7 * ix[0] + 3 * ix[1]) % 6) as i64);
        let gtable = ArrayD::from_shape_fn(IxDyn(&[6, 4]), |ix| (ix[0] as f32) - 0.25 * ix[1] as f32);
        let ids: Ids = Dt::distribute(&gids, &mesh)?;
        let table: Dt<f32, (dp, tp), (Replicate, Shard<1>), 2> = Dt::distribute(&gtable, &mesh)?;
        let y = embed(&ids, &table)?;
        let glogits = ArrayD::from_shape_fn(IxDyn(&[3, 6]), |ix| ((ix[0] * 5 + ix[1] * 3) % 7) as f32 * 0.5);
        let logits: Dt<f32, (dp, tp), (Replicate, Shard<1>), 2> = Dt::distribute(&glogits, &mesh)?;
        let targets: Dt<i32, (dp, tp), (Replicate, Replicate), 1> =
            Dt::distribute(&ArrayD::from_shape_vec(IxDyn(&[3]), vec![5, 0, 2]).unwrap(), &mesh)?;
        let l = loss(&logits, &targets)?;
        let huge = ArrayD::from_shape_fn(IxDyn(&[3, 5]), |ix| (1i64 << 62) + (ix[0] * 5 + ix[1]) as i64 - 7);
        let g = gather_ids(Dt::distribute(&huge, &mesh)?)?;
        assert_eq!(g.full_tensor()?, huge);
        Ok((ids.full_tensor()?, y.full_tensor()?, l.full_tensor()?, g.to_host()?))
    })
    .unwrap()
}

fn main() {
    let one = pipeline(1, &[1, 1]).remove(0);
    for got in pipeline(4, &[2, 2]) {
        assert_eq!(got.0, one.0);
        assert_eq!(got.1, one.1);
        assert!((got.2.sum() - one.2.sum()).abs() <= 1e-6 * one.2.sum().abs(), "{} vs {}", got.2, one.2);
        assert_eq!(got.3, one.3);
    }
}
