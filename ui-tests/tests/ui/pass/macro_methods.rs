// `#[distribute]` on impl blocks (inherent and trait) and inference through concrete
// signatures: no annotation on the caller's side, and `.redistribute()` takes its target from
// the callee.
use dtensor::ndarray::ArrayD;
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, run, DTensor, Dt, Forward, Replicate, Result, Shard};

#[distribute(mesh = "dp,tp")]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f32>,
    #[placements = [Replicate, Shard(0)]]
    pub w2: DTensor<f32>,
}

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
pub fn block_forward(x: &DTensor<f32>, b: &Block) -> Result<DTensor<f32>> {
    let h = x.matmul(&b.w1)?.relu()?;
    h.matmul(&b.w2)?.redistribute()
}

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
impl Block {
    pub fn twice(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        let h = block_forward(x, self)?; // no annotation: the signature is concrete
        block_forward(&h, self)
    }
}

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
impl Forward<f32> for Block {
    fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> {
        self.twice(x)
    }
}

/// A generic impl block: the element type stays generic in the typed signature.
pub struct Doubler<T>(std::marker::PhantomData<T>);

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate])]
impl<T: dtensor::Element> Doubler<T> {
    pub fn double(&self, x: &DTensor<T>) -> Result<DTensor<T>> {
        x.add(x)
    }
}

fn main() {
    let out = run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let b = Block::distribute(BlockGlobal { w1: ArrayD::ones(vec![3, 4]), w2: ArrayD::ones(vec![4, 3]) }, &mesh)?;
        let x: Dt<f32, (dp, tp), (Replicate, Replicate), 2> = Dt::distribute(&ArrayD::ones(vec![2, 3]), &mesh)?;
        // The target layout of `redistribute` is inferred from `block_forward`'s signature.
        let y = block_forward(&x.redistribute()?, &b)?;
        let z = Forward::forward(&b, y.as_dtensor())?;
        let z: Dt<f32, (dp, tp), (Shard<0>, Replicate), 2> = Dt::from_dtensor(z)?;
        Doubler(std::marker::PhantomData).double(&z)?.full_tensor()
    })
    .unwrap();
    // ones(2,3) @ ones(3,4) = 3, relu, @ ones(4,3) = 12; twice more: 12*3*4 = 144, 144*3*4 = 1728;
    // doubled: 3456.
    assert!(out.iter().all(|z| z.iter().all(|&v| v == 3456.0)), "{out:?}");
}
