//! Element-wise kernels, compiled once per device with NVRTC, for f32 and f64.
//!
//! Binary kernels compute `out[i] = f(a[i], b[i])`, unary ones `out[i] = f(a[i], s)` with a
//! scalar argument `s` (used by `scale` and `add_scalar`). `storage::cuda` maps the op enums
//! onto these names.

use super::{cuda_err, require, CudaLib};
use crate::error::Result;
use crate::storage::op::{GELU_A, GELU_C};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use std::sync::Arc;

/// The kernels. `GELU_C` and `GELU_A` are defined in front of it from the host formula's
/// constants, so both devices compute the same (tanh) GELU.
const SOURCE: &str = r#"
#define IDX unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; if (i >= n) return;
#define BIN_T(name, T, sfx, expr) extern "C" __global__ void name##_##sfx(const T* a, const T* b, T* o, unsigned long long n) { IDX T x = a[i]; T y = b[i]; o[i] = (expr); }
#define UN_T(name, T, sfx, expr) extern "C" __global__ void name##_##sfx(const T* a, T s, T* o, unsigned long long n) { IDX T x = a[i]; o[i] = (expr); }
#define BIN(name, expr) BIN_T(name, float, f32, expr) BIN_T(name, double, f64, expr)
#define UN(name, expr) UN_T(name, float, f32, expr) UN_T(name, double, f64, expr)
BIN(add, x + y)
BIN(sub, x - y)
BIN(mul, x * y)
BIN(div, x / y)
UN(relu, x > 0 ? x : 0)
UN(gelu, 0.5 * x * (1 + tanh(GELU_C * (x + GELU_A * x * x * x))))
UN(exp, exp(x))
UN(neg, -x)
UN(scale, x * s)
UN(add_scalar, x + s)
"#;

/// The compiled module of one device.
#[derive(Debug)]
pub struct Kernels {
    module: Arc<CudaModule>,
}

impl Kernels {
    pub(crate) fn compile(ctx: &Arc<CudaContext>) -> Result<Kernels> {
        require(CudaLib::Nvrtc)?;
        let source = format!("#define GELU_C {GELU_C:?}\n#define GELU_A {GELU_A:?}\n{SOURCE}");
        let ptx = cudarc::nvrtc::compile_ptx(source).map_err(|e| cuda_err("compiling element-wise kernels", e))?;
        let module = ctx.load_module(ptx).map_err(|e| cuda_err("loading element-wise kernels", e))?;
        Ok(Kernels { module })
    }

    /// The kernel `op` for element type suffix `sfx` (`f32` / `f64`).
    pub(crate) fn function(&self, op: &str, sfx: &str) -> Result<CudaFunction> {
        self.module.load_function(&format!("{op}_{sfx}")).map_err(|e| cuda_err(&format!("kernel {op}_{sfx}"), e))
    }
}
