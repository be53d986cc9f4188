// `fsdp` names the mesh dim the parameters rest sharded over: it must be a dim of the mesh.
use dtensor::{distribute, DTensor};

#[distribute(mesh = "dp,tp", fsdp = "pp")]
pub struct Block {
    #[placements = [Replicate, Shard(1)]]
    pub w1: DTensor<f64>,
}

// `fsdp` is about parameters at rest: a function has none.
#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate], fsdp = "dp")]
fn f(x: &DTensor<f64>) -> dtensor::Result<DTensor<f64>> {
    Ok(x.clone())
}

fn main() {}
