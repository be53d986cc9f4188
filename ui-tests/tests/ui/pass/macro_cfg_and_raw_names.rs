//! `#[cfg]` on `#[distribute]` fields (everything generated about a field is compiled with
//! it) and raw identifiers (`r#type` is the parameter `type`, as PyTorch would name it).
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::{distribute, DTensor, Replicate, Shard};

#[distribute(mesh = "tp", placements = [Replicate])]
pub struct Block {
    #[placements = [Shard(0)]]
    pub r#type: DTensor<f32>,
    /// Compiled out: no field, no global field, no parameter.
    #[cfg(any())]
    pub gone: DTensor<f32>,
    /// Compiled in.
    #[cfg(all())]
    pub kept: DTensor<f32, 1>,
    #[cfg(any())]
    pub gone_label: &'static str,
}

fn main() {
    let out = dtensor::run(2, |ctx| {
        let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
        let g = BlockGlobal { r#type: ArrayD::ones(IxDyn(&[4, 2])), kept: ArrayD::ones(IxDyn(&[3])) };
        let b = Block::distribute(g, &mesh)?;
        assert_eq!(b.r#type.local().shape(), &[2, 2]);
        Ok(b.parameter_placements())
    })
    .unwrap();
    for p in out {
        assert_eq!(p, vec![("type".to_string(), vec![Shard(0)]), ("kept".to_string(), vec![Replicate])]);
    }
}
