//! The device kernels of [`source`](super::source), compiled with NVRTC once per device and
//! cached on the [`CudaDevice`](super::CudaDevice).

use super::source::module_source;
use super::{cuda_err, require, CudaLib};
use crate::error::Result;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The compiled module of one device and the functions looked up so far.
#[derive(Debug)]
pub struct Kernels {
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

/// NVRTC options of every kernel compile: `--fmad=false` keeps `a * b + c` two roundings, as
/// on the host (see [`source`](super::source)); `arch` is `compute_XY` of the target device.
pub fn compile_options(arch: &str) -> CompileOptions {
    CompileOptions {
        fmad: Some(false),
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some("dtensor_kernels.cu".into()),
        ..Default::default()
    }
}

/// Compiles the whole kernel module to PTX for `arch` (`compute_90` for an H100/H200).
pub fn compile_ptx(arch: &str) -> Result<Ptx> {
    require(CudaLib::Nvrtc)?;
    compile_ptx_with_opts(module_source(), compile_options(arch))
        .map_err(|e| cuda_err(&format!("compiling the device kernels for {arch}"), e))
}

impl Kernels {
    /// The kernels of the device of `ctx`, compiled on first use and cached per device
    /// ordinal for the process (every rank's handle of a device shares the primary context,
    /// so ranks on one GPU compile once).
    pub(crate) fn for_device(ctx: &Arc<CudaContext>) -> Result<Arc<Kernels>> {
        static CACHE: OnceLock<Mutex<HashMap<usize, Arc<Kernels>>>> = OnceLock::new();
        let mut cache = CACHE.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&ctx.ordinal()) {
            return Ok(Arc::clone(k));
        }
        let k = Arc::new(Self::compile(ctx)?);
        cache.insert(ctx.ordinal(), Arc::clone(&k));
        Ok(k)
    }

    /// Compiles the kernels for the device of `ctx` and loads them.
    fn compile(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        let (major, minor) = ctx.compute_capability().map_err(|e| cuda_err("device compute capability", e))?;
        let ptx = compile_ptx(&format!("compute_{major}{minor}"))?;
        let module = ctx.load_module(ptx).map_err(|e| cuda_err("loading the device kernels", e))?;
        Ok(Kernels { module, functions: Mutex::new(HashMap::new()) })
    }

    /// The kernel `name` for element type suffix `sfx` (`f32` / `f64`).
    pub(crate) fn function(&self, name: &str, sfx: &str) -> Result<CudaFunction> {
        let full = format!("{name}_{sfx}");
        let mut f = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = f.get(&full) {
            return Ok(k.clone());
        }
        let k = self.module.load_function(&full).map_err(|e| cuda_err(&format!("kernel {full}"), e))?;
        f.insert(full, k.clone());
        Ok(k)
    }
}
