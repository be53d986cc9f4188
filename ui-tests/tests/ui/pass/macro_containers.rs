//! Tensors in containers: `&[DTensor]` and `Option<&DTensor>` arguments are typed, a tuple
//! result takes one layout per tensor (`returns = [[..], [..]]`), `crate = ".."` names the
//! facade crate, and a container-only struct with `elem` nests generic modules.
use dtensor::ndarray::{ArrayD, IxDyn};
use dtensor::typed::dims::{dp, tp};
use dtensor::{distribute, DTensor, Dt, Element, Replicate, Result, Shard};

mod renamed {
    pub use dtensor as dt;
}

#[distribute(mesh = "dp,tp", placements = [Replicate, Shard(1)], crate = "crate::renamed::dt")]
pub struct Block<T: Element> {
    pub w: DTensor<T>,
}

#[distribute(mesh = "dp,tp", elem = T)]
pub struct Stack<T: Element> {
    pub blocks: Vec<Block<T>>,
    pub head: Option<Block<T>>,
}

type Act = Dt<f32, (dp, tp), (Shard<0>, Replicate), 2>;

#[distribute(mesh = "dp,tp", placements = [Shard(0), Replicate], returns = [[Shard(0), Replicate], [Replicate, Replicate]])]
fn sum_all(xs: &[DTensor<f32>], extra: Option<&DTensor<f32>>) -> Result<(DTensor<f32>, DTensor<f32>)> {
    let mut acc: Act = xs[0].clone();
    for x in &xs[1..] {
        acc = acc.add(x)?;
    }
    if let Some(e) = extra {
        acc = acc.add(e)?;
    }
    let full = acc.redistribute()?;
    Ok((acc, full))
}

fn main() {
    let out = dtensor::run(4, |ctx| {
        let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
        let g = ArrayD::<f32>::ones(IxDyn(&[4, 2]));
        let x: Act = Dt::distribute(&g, &mesh)?;
        let (s, full) = sum_all(&[x.clone(), x.clone()], Some(&x))?;
        assert_eq!(s.shape(), &[4, 2]);
        let stack = Stack::distribute(
            StackGlobal { blocks: vec![BlockGlobal { w: g.clone() }], head: Some(BlockGlobal { w: g.clone() }) },
            &mesh,
        )?;
        let names: Vec<String> = stack.named_parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["blocks.0.w", "head.w"]);
        Ok(full.full_tensor()?)
    })
    .unwrap();
    for full in out {
        assert_eq!(full, ArrayD::from_elem(IxDyn(&[4, 2]), 3.0f32));
    }
}
