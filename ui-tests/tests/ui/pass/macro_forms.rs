//! The other forms `#[distribute]` accepts: a struct-level default, placements by mesh dim name,
//! negative shard dims, an explicit rank, a custom mesh dim name, `#[placements(..)]` on an
//! argument, a Partial argument and an explicit `returns`, a generic element type.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::{distribute, DTensor, Dt, Element, Partial, Replicate, Shard, Sum};

dtensor::mesh_dim!(pub expert);

#[distribute(mesh = "expert,tp", placements = [Shard(0), Replicate])]
pub struct Experts<T: Element> {
    /// `[experts, d, d]`: one slice of experts per `expert` rank (the default).
    pub w: DTensor<T, 3>,
    /// By name: `tp` only, the last dim (`expert` defaults to Replicate).
    #[placements = [tp = Shard(-1)]]
    pub gate: DTensor<T>,
    pub label: &'static str,
}

#[distribute(mesh = "expert,tp", placements = [Replicate, Partial(Sum)], returns = [Replicate, Replicate])]
fn reduce<T: Element>(partial: &DTensor<T>, #[placements(Replicate, Replicate)] bias: DTensor<T>) -> dtensor::Result<DTensor<T>> {
    partial.redistribute::<(Replicate, Replicate)>()?.add(&bias)
}

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["expert", "tp"])?;
        let w = ArrayD::<f32>::ones(IxDyn(&[4, 3, 3]));
        let gate = ArrayD::<f32>::ones(IxDyn(&[3, 4]));
        let e = Experts::distribute(ExpertsGlobal { w, gate, label: "moe" }, &mesh)?;
        assert_eq!(e.label, "moe");
        assert_eq!(e.w.local().shape(), &[2, 3, 3]);
        assert_eq!(e.gate.local().shape(), &[3, 2]);
        assert_eq!(
            e.parameter_placements(),
            vec![
                ("w".to_string(), vec![dtensor::Shard(0), dtensor::Replicate]),
                ("gate".to_string(), vec![dtensor::Replicate, dtensor::Shard(1)])
            ]
        );
        assert_eq!(Experts::<f32>::MESH_DIMS, &["expert", "tp"]);
        // A partial sum made by a row-parallel matmul, reduced by the typed function.
        let a: Dt<f32, (expert, dtensor::typed::dims::tp), (Replicate, Shard<1>), 2> =
            Dt::distribute(&ArrayD::ones(IxDyn(&[2, 4])), &mesh)?;
        let b: Dt<f32, _, (Replicate, Shard<0>), 2> = Dt::distribute(&ArrayD::ones(IxDyn(&[4, 2])), &mesh)?;
        let p: Dt<f32, _, (Replicate, Partial<Sum>), 2> = a.matmul(&b)?;
        let bias: Dt<f32, _, (Replicate, Replicate), 2> = Dt::distribute(&ArrayD::ones(IxDyn(&[2, 2])), &mesh)?;
        Ok(reduce(&p, bias)?.to_local())
    })
    .unwrap();
    for local in out {
        assert_eq!(local, ArrayD::from_elem(IxDyn(&[2, 2]), 5.0f32));
    }
}
