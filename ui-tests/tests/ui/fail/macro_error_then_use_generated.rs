// After an error in the struct, the code that uses what the macro generates
// (`LayerGlobal`, `Layer::distribute`, `named_parameters`, the `Module` impl) adds no errors.
use dtensor::{distribute, DTensor, Module};

#[distribute(mesh = "dp,tp")]
pub struct Layer {
    #[placements = [Replicate, Shard(7)]]
    pub w: DTensor<f32>,
    pub steps: usize,
}

fn names<M: Module<f32>>(m: &M) -> usize {
    m.named_parameters().len()
}

fn main() {
    let _ = dtensor::run(1, |ctx| {
        let mesh = ctx.init_device_mesh(&[1, 1], &["dp", "tp"])?;
        let g = LayerGlobal { w: dtensor::ndarray::ArrayD::zeros(vec![2, 2]), steps: 1 };
        let l = Layer::distribute(g, &mesh)?;
        let _ = l.named_parameters();
        let _ = l.parameter_placements();
        Ok(names(&l) + l.steps + l.w.shape().len())
    });
}
