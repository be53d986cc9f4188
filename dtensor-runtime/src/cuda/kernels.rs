//! The device kernels of [`source`](super::source), compiled with NVRTC once per device and
//! cached on the [`CudaDevice`](super::CudaDevice).

use super::source::{has_kernel, module_source};
use super::{cuda_err, require, CudaLib};
use crate::error::Result;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// The compiled module of one device and the functions looked up so far.
#[derive(Debug)]
pub struct Kernels {
    module: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

/// NVRTC options of every kernel compile for `arch` (`compute_XY` for PTX, `sm_XY` for
/// machine code): `--fmad=false` keeps `a * b + c` two roundings, as on the host (see
/// [`source`](super::source)).
pub fn nvrtc_options(arch: &str) -> Vec<String> {
    vec!["--fmad=false".into(), format!("--gpu-architecture={arch}"), "--std=c++17".into()]
}

/// Compiles the whole kernel module to PTX for a virtual `arch` (`compute_90` for an H100/H200).
pub fn compile_ptx(arch: &str) -> Result<Ptx> {
    require(CudaLib::Nvrtc)?;
    let opts = CompileOptions { options: nvrtc_options(arch), name: Some(NAME.into()), ..Default::default() };
    compile_ptx_with_opts(module_source(), opts)
        .map_err(|e| cuda_err(&format!("compiling the device kernels for {arch}"), e))
}

/// Compiles the whole kernel module to machine code (CUBIN) for a real `arch` (`sm_90`).
///
/// Machine code loads on any driver of the CUDA major version NVRTC belongs to; PTX needs a
/// driver at least as new as NVRTC (its JIT rejects newer PTX), which a pip NVRTC newer than
/// the installed driver breaks. So devices load CUBIN, and PTX only as a fallback.
pub fn compile_cubin(arch: &str) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    require(CudaLib::Nvrtc)?;
    let what = format!("compiling the device kernels for {arch}");
    let src = CString::new(module_source()).map_err(|e| cuda_err(&what, e))?;
    let name = CString::new(NAME).map_err(|e| cuda_err(&what, e))?;
    let prog = result::create_program(&src, Some(&name)).map_err(|e| cuda_err(&what, e))?;
    // SAFETY: `prog` was created above and is destroyed exactly once, below.
    let out = unsafe {
        match result::compile_program(prog, &nvrtc_options(arch)) {
            Err(e) => {
                let log =
                    result::get_program_log(prog).map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned());
                Err(cuda_err(&what, format!("{e:?}: {}", log.unwrap_or_default())))
            }
            Ok(()) => {
                let mut size = 0usize;
                let mut cubin = Vec::new();
                let r = sys::nvrtcGetCUBINSize(prog, &mut size).result().and_then(|()| {
                    cubin = vec![0u8; size];
                    sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr().cast()).result()
                });
                r.map(|()| cubin).map_err(|e| cuda_err(&what, e))
            }
        }
    };
    // SAFETY: as above.
    unsafe { result::destroy_program(prog) }.map_err(|e| cuda_err("releasing the NVRTC program", e))?;
    out
}

/// The source file name in NVRTC's messages.
const NAME: &str = "dtensor_kernels.cu";

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
        let module = match compile_cubin(&format!("sm_{major}{minor}")) {
            Ok(cubin) => ctx.load_module(Ptx::from_binary(cubin)),
            Err(_) => ctx.load_module(compile_ptx(&format!("compute_{major}{minor}"))?),
        }
        .map_err(|e| cuda_err("loading the device kernels", e))?;
        Ok(Kernels { module, functions: Mutex::new(HashMap::new()) })
    }

    /// The kernel `name` for element type suffix `sfx` (`f32`, `bf16`, `i64`, ...), or the
    /// typed error of a dtype without it (see [`has_kernel`]).
    pub(crate) fn function(&self, name: &str, sfx: &str) -> Result<CudaFunction> {
        if !has_kernel(name, sfx) {
            return Err(super::no_kernels(name, sfx));
        }
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
