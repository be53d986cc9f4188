//! `distribute_module` (PyTorch semantics).

use super::{Forward, LayerHooks, Module};
use crate::dtensor::{distribute_tensor, DTensor};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::mesh::DeviceMesh;
use crate::placement::Placement;

/// Chooses a parameter's placements from its path (`None`: replicate it).
pub type PartitionFn<'a, T> = &'a dyn Fn(&str, &DTensor<T>, &DeviceMesh) -> Result<Option<Vec<Placement>>>;
/// Runs on the module's input before forward.
pub type InputFn<T> = Box<dyn Fn(&DTensor<T>, &DeviceMesh) -> Result<DTensor<T>> + Send + Sync>;
/// Runs on the module's output after forward.
pub type OutputFn<T> = Box<dyn Fn(&DTensor<T>, &DeviceMesh) -> Result<DTensor<T>> + Send + Sync>;

/// A module whose parameters live on a mesh, with the input/output functions of
/// [`distribute_module`] around its forward.
pub struct Distributed<T: Element, M> {
    /// The module (its parameters are DTensors on `mesh`).
    pub module: M,
    /// The mesh.
    pub mesh: DeviceMesh,
    input_fn: Option<InputFn<T>>,
    output_fn: Option<OutputFn<T>>,
}

impl<T: Element, M: Module<T>> Module<T> for Distributed<T, M> {
    fn named_parameters(&self) -> Vec<(String, &DTensor<T>)> {
        self.module.named_parameters()
    }
    fn named_parameters_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        self.module.named_parameters_mut()
    }
    fn named_buffers(&self) -> Vec<(String, &DTensor<T>)> {
        self.module.named_buffers()
    }
    fn named_buffers_mut(&mut self) -> Vec<(String, &mut DTensor<T>)> {
        self.module.named_buffers_mut()
    }
    fn layer_hooks_mut(&mut self, path: &str) -> Option<&mut LayerHooks> {
        self.module.layer_hooks_mut(path)
    }
}

impl<T: Element, M: Forward<T>> Forward<T> for Distributed<T, M> {
    fn forward(&self, input: &DTensor<T>) -> Result<DTensor<T>> {
        let x = match &self.input_fn {
            Some(f) => f(input, &self.mesh)?,
            None => input.clone(),
        };
        let y = self.module.forward(&x)?;
        match &self.output_fn {
            Some(f) => f(&y, &self.mesh),
            None => Ok(y),
        }
    }
}

/// Fails unless every parameter and buffer is still a local tensor.
pub(crate) fn check_not_distributed<T: Element, M: Module<T>>(module: &M, context: &str) -> Result<()> {
    for (name, p) in module.named_parameters().into_iter().chain(module.named_buffers()) {
        if !p.is_local_tensor() {
            return Err(Error::Module(format!(
                "{context}: `{name}` is already a DTensor on {}; a module can be distributed only once",
                p.device_mesh()
            )));
        }
    }
    Ok(())
}

/// Replaces a local parameter by a DTensor on `mesh` laid out as `placements`, scattered from
/// rank 0 (PyTorch's `src_data_rank=0`); keeps `requires_grad`.
pub(crate) fn distribute_param<T: Element>(
    p: &mut DTensor<T>,
    mesh: &DeviceMesh,
    placements: &[Placement],
) -> Result<()> {
    let rg = p.requires_grad();
    *p = distribute_tensor(p.local(), mesh, placements, Some(0))?.requires_grad_(rg);
    Ok(())
}

/// Distributes a module's parameters over `mesh` (PyTorch `distribute_module`).
///
/// `partition_fn(path, param, mesh)` returns a parameter's placements; every parameter it
/// leaves out (returns `None` for), and every parameter when there is no `partition_fn`, is
/// replicated; buffers are replicated. `input_fn` / `output_fn` wrap the forward of the
/// returned [`Distributed`]. Calling it on a module that is already distributed is an error.
///
/// ```
/// use dtensor_runtime::module::{distribute_module, Linear, Module};
/// use dtensor_runtime::{run, Replicate, Shard};
/// run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
///     let lin = Linear::<f32>::new(4, 6, true)?;
///     let shard_weight = |name: &str, _: &_, _: &_| Ok(if name == "weight" { Some(vec![Shard(0)]) } else { None });
///     let d = distribute_module(lin, &mesh, Some(&shard_weight), None, None)?;
///     let pl: Vec<_> = d.named_parameters().into_iter().map(|(n, p)| (n, p.placements().to_vec())).collect();
///     assert_eq!(pl, vec![("weight".to_string(), vec![Shard(0)]), ("bias".to_string(), vec![Replicate])]);
///     assert!(distribute_module(d, &mesh, None, None, None).is_err()); // twice
///     Ok(())
/// }).unwrap();
/// ```
pub fn distribute_module<T: Element, M: Module<T>>(
    mut module: M,
    mesh: &DeviceMesh,
    partition_fn: Option<PartitionFn<'_, T>>,
    input_fn: Option<InputFn<T>>,
    output_fn: Option<OutputFn<T>>,
) -> Result<Distributed<T, M>> {
    check_not_distributed(&module, "distribute_module")?;
    let replicate = vec![Placement::Replicate; mesh.ndim()];
    for (name, p) in module.named_parameters_mut() {
        let placements = match partition_fn {
            Some(f) => f(&name, p, mesh)?.unwrap_or_else(|| replicate.clone()),
            None => replicate.clone(),
        };
        distribute_param(p, mesh, &placements)?;
    }
    for (_, b) in module.named_buffers_mut() {
        distribute_param(b, mesh, &replicate)?;
    }
    Ok(Distributed { module, mesh: mesh.clone(), input_fn, output_fn })
}
