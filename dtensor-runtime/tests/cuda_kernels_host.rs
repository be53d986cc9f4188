//! The CUDA kernels' C text, compiled by the host C++ compiler with a thin emulation of the
//! CUDA built-ins (one thread per block, blocks run in turn, a small grid so the grid-stride
//! loops wrap), called with the arguments `dtensor_runtime::cuda::args` builds for the device,
//! against the host kernels of the same ops. Catches indexing, broadcasting, reduction,
//! pack-table and formula mistakes on a machine without a GPU; the device tests
//! (`tests/cuda_ops.rs`) check the real thing. Without a C++ compiler the test prints why and
//! passes.
#![cfg(unix)]

mod common;

use common::{adamw_step_at, cat_shapes, global};
use dtensor_runtime::cuda::args::{self, Gather, Reduce, Strided};
use dtensor_runtime::cuda::source::{module_source, BLOCK};
use dtensor_runtime::layout::pack;
use dtensor_runtime::ndarray::{ArrayD, IxDyn};
use dtensor_runtime::op::{BinaryOp, Distribution, RandomFill, Reduction, SgdStep, SoftmaxKind, UnaryOp};
use dtensor_runtime::Target;
use dtensor_runtime::{Element, Scalar, Storage};
use std::ffi::{c_void, CString};
use std::process::Command;

/// The CUDA built-ins the kernels use, on the host, for blocks of one thread.
const SHIM: &str = r#"
#include <cmath>
#include <cstring>
struct dt_dim3 { unsigned x, y, z; };
static dt_dim3 blockIdx, threadIdx, blockDim, gridDim;
extern "C" void dt_emu_set(unsigned grid, unsigned block) {
    gridDim.x = grid; blockDim.x = 1; blockIdx.x = block; threadIdx.x = 0;
}
#define __global__
#define __device__
#define __shared__ static
#define __syncthreads() do {} while (0)
static inline double __longlong_as_double(long long v) { double d; std::memcpy(&d, &v, 8); return d; }
static inline float __uint_as_float(unsigned int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int v; std::memcpy(&v, &f, 4); return v; }
static inline int atomicExch(int* p, int v) { int o = *p; *p = v; return o; }
template <typename T> static inline T atomicAdd(T* p, T v) { T o = *p; *p = o + v; return o; }
using std::exp; using std::log; using std::tanh; using std::sqrt; using std::floor; using std::frexp;
using std::erf; using std::log1p; using std::pow; using std::fabs;
"#;

struct Emu {
    lib: *mut c_void,
    _dir: tempfile::TempDir,
}

impl Emu {
    /// Compiles the kernels for the host, or `None` (printed) without a C++ compiler.
    fn build() -> Option<Emu> {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("kernels.cpp");
        let so = dir.path().join("libkernels.so");
        let text = module_source().replace(&format!("#define BLOCK {BLOCK}\n"), "#define BLOCK 1\n");
        std::fs::write(&src, format!("{SHIM}{text}")).unwrap();
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let out = Command::new(&cxx)
            .args(["-std=c++17", "-O1", "-shared", "-fPIC", "-ffp-contract=off", "-w", "-o"])
            .arg(&so)
            .arg(&src)
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!("{cxx} rejected the kernel source: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => {
                println!("skipping: no host C++ compiler `{cxx}` ({e})");
                return None;
            }
        }
        let path = CString::new(so.to_str().unwrap()).unwrap();
        // SAFETY: loads the library just built; kept open for the test.
        let lib = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!lib.is_null(), "dlopen of the host kernels failed");
        Some(Emu { lib, _dir: dir })
    }

    /// The kernel `name` as a function of type `F` (the caller states its C signature).
    fn kernel<F: Copy>(&self, name: &str) -> F {
        let c = CString::new(name).unwrap();
        // SAFETY: dlsym on the open library; a missing name is a test failure.
        let p = unsafe { libc::dlsym(self.lib, c.as_ptr()) };
        assert!(!p.is_null(), "kernel {name} missing");
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
        // SAFETY: F is the extern "C" fn type of the kernel's C signature.
        unsafe { std::mem::transmute_copy(&p) }
    }

    /// Runs `launch` once per block of a `grid`-block grid.
    fn grid(&self, grid: u32, mut launch: impl FnMut()) {
        let set: unsafe extern "C" fn(u32, u32) = self.kernel("dt_emu_set");
        for b in 0..grid.max(1) {
            // SAFETY: sets the emulated built-ins.
            unsafe { set(grid.max(1), b) };
            launch();
        }
    }
}

/// A float's device view: the type its kernels compute in and take scalars in (f32 for the
/// 16-bit floats) and the tolerance of its inexact results against the host's (a rounding step
/// of the 16-bit types, whose f32 intermediates may round the other way).
trait Dev: Element {
    type A: Copy + std::ops::Div<Output = Self::A>;
    const TOL: f64;
    fn a(v: f64) -> Self::A;
}

macro_rules! dev {
    ($t:ty, $a:ty, $tol:expr) => {
        impl Dev for $t {
            type A = $a;
            const TOL: f64 = $tol;
            fn a(v: f64) -> $a {
                v as $a
            }
        }
    };
}
dev!(f32, f32, 1e-6);
dev!(f64, f64, 1e-6);
dev!(dtensor_runtime::bf16, f32, 1.0 / 128.0);
dev!(dtensor_runtime::f16, f32, 1.0 / 1024.0);

fn sfx<T: Element>() -> String {
    T::DTYPE.to_string()
}

fn cpu<T: Element>(s: Storage<T>) -> ArrayD<T> {
    s.into_host().unwrap()
}

fn same<T: Element>(a: &ArrayD<T>, b: &ArrayD<T>) -> bool {
    a.shape() == b.shape() && a.iter().zip(b).all(|(&x, &y)| x == y || (x.is_nan() && y.is_nan()))
}

fn close<T: Element>(a: &ArrayD<T>, b: &ArrayD<T>, tol: f64) -> bool {
    a.shape() == b.shape()
        && a.iter().zip(b).all(|(&x, &y)| (x.as_f64() - y.as_f64()).abs() <= tol * (1.0 + y.as_f64().abs()))
}

fn arr<T: Element>(shape: &[usize], seed: u64, scale: f64) -> ArrayD<T> {
    global(shape, seed).mapv(|v| T::of_f64(v * scale))
}

fn zeros<T: Element>(shape: &[usize]) -> ArrayD<T> {
    ArrayD::zeros(IxDyn(shape))
}

type Unary<T> = unsafe extern "C" fn(*const T, *mut T, u64, i32, <T as Dev>::A, <T as Dev>::A);
type Binary<T> = unsafe extern "C" fn(*const T, *const T, *mut T, u64, i32, Strided);
type ReduceK<T> = unsafe extern "C" fn(*const T, *mut T, u64, u64, i32, i32, <T as Dev>::A, Reduce);
type Softmax<T> = unsafe extern "C" fn(*const T, *mut T, u64, u64, u64, i32);
type SoftmaxBwd<T> = unsafe extern "C" fn(*const T, *const T, *mut T, u64, u64, u64, i32);
type Pack<T> = unsafe extern "C" fn(*const T, *mut T, *const u64, u64, u64);
type Embed<T> = unsafe extern "C" fn(*const T, *const i64, *mut T, u64, u64, u64, u64, u64, *mut i32);
type OneHot<T> = unsafe extern "C" fn(*const i64, *mut T, u64, u64, *mut i32);
type Random<T> = unsafe extern "C" fn(*mut T, u64, Strided, u64, u32, u32, u64, i32);
type Arg<T> = <T as Dev>::A;
type SgdK<T> = unsafe extern "C" fn(*mut T, *const T, u64, Arg<T>, Arg<T>);
type SgdMomentum<T> = unsafe extern "C" fn(*mut T, *const T, *mut T, u64, Arg<T>, Arg<T>, Arg<T>, i32);
type AdamWK<T> =
    unsafe extern "C" fn(*mut T, *const T, *mut T, *mut T, u64, Arg<T>, Arg<T>, Arg<T>, Arg<T>, Arg<T>, Arg<T>, Arg<T>);
type Fill<T> = unsafe extern "C" fn(*mut T, u64, T);
type Cast<A, B> = unsafe extern "C" fn(*const A, *mut B, u64);
type Where<T> = unsafe extern "C" fn(*const T, *const T, *const T, *mut T, u64, Strided, Strided);
type Tri<T> = unsafe extern "C" fn(*const T, *mut T, u64, u64, u64, i32, i64, i64, i64);
type ArgReduce<T> = unsafe extern "C" fn(*const T, *mut i64, u64, u64, u64, i32);
type CatK<T> = unsafe extern "C" fn(*const T, *mut T, u64, u64, u64, u64);
type CheckIds = unsafe extern "C" fn(*const i64, u64, u64, *mut i32);
type IndexK<T> = unsafe extern "C" fn(*const T, *const i64, *mut T, u64, u64, u64, u64);
type GatherK<T> = unsafe extern "C" fn(*const T, *const i64, *mut T, u64, u64, Gather);

fn elementwise<T: Dev>(e: &Emu) {
    let s = sfx::<T>();
    let x = arr::<T>(&[5, 7], 1, 1.0 / 12.0);
    let pos = x.mapv(|v| v.abs() + T::of_f64(0.25));
    let un: Unary<T> = e.kernel(&format!("unary_{s}"));
    for op in [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::Tanh,
        UnaryOp::Sqrt,
        UnaryOp::AddScalar(1.25),
        UnaryOp::MulScalar(-0.75),
        UnaryOp::ReluGrad,
        UnaryOp::GeluGrad,
        UnaryOp::TanhGrad,
        UnaryOp::SqrtGrad,
        UnaryOp::Silu,
        UnaryOp::SiluGrad,
        UnaryOp::Sigmoid,
        UnaryOp::SigmoidGrad,
        UnaryOp::Softplus { beta: 1.5, threshold: 2.0 },
        UnaryOp::SoftplusGrad { beta: 1.5, threshold: 2.0 },
        UnaryOp::Pow(2.5),
        UnaryOp::PowGrad(2.5),
        UnaryOp::PowGrad(0.0),
        UnaryOp::Rsqrt,
        UnaryOp::RsqrtGrad,
        UnaryOp::Abs,
        UnaryOp::Sign,
        UnaryOp::Clamp { lo: -0.25, hi: 0.5 },
        UnaryOp::Clamp { lo: 0.5, hi: -0.25 },
        UnaryOp::ClampGrad { lo: -0.25, hi: 0.5 },
        UnaryOp::GeluErf,
        UnaryOp::GeluErfGrad,
        UnaryOp::DropoutScale(0.3),
        UnaryOp::NonZero,
    ] {
        let positive = matches!(
            op,
            UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::SqrtGrad | UnaryOp::Pow(_) | UnaryOp::PowGrad(_) | UnaryOp::Rsqrt
        );
        let input = if positive { &pos } else { &x };
        let mut out = zeros::<T>(&[5, 7]);
        let (n, code) = (35u64, args::unary_code(op).unwrap());
        let (sc, tc) = args::unary_scalars(op);
        let (sc, tc) = (T::a(sc), T::a(tc));
        // SAFETY: buffers of n elements.
        e.grid(3, || unsafe { un(input.as_ptr(), out.as_mut_ptr(), n, code, sc, tc) });
        assert!(close(&out, &cpu(Storage::Cpu(input.clone()).unary(op).unwrap()), T::TOL), "{op} {s}");
    }
    // NaN, ±0 and ±∞ through the ops with special cases (sign, clamp, abs, comparisons below).
    let special = ArrayD::from_shape_vec(
        IxDyn(&[6]),
        [f64::NAN, 0.0, -0.0, f64::INFINITY, f64::NEG_INFINITY, 0.75].map(T::of_f64).to_vec(),
    )
    .unwrap();
    for op in [
        UnaryOp::Sign,
        UnaryOp::Abs,
        UnaryOp::Clamp { lo: -0.25, hi: 0.5 },
        UnaryOp::ClampGrad { lo: -0.25, hi: 0.5 },
        UnaryOp::NonZero,
        UnaryOp::Relu,
    ] {
        let mut out = zeros::<T>(&[6]);
        let code = args::unary_code(op).unwrap();
        let (sc, tc) = args::unary_scalars(op);
        let (sc, tc) = (T::a(sc), T::a(tc));
        // SAFETY: 6 elements.
        e.grid(2, || unsafe { un(special.as_ptr(), out.as_mut_ptr(), 6, code, sc, tc) });
        let want = cpu(Storage::Cpu(special.clone()).unary(op).unwrap());
        assert!(
            same(&out, &want)
                && out.iter().zip(&want).all(|(x, y)| x.is_sign_negative() == y.is_sign_negative() || x.is_nan()),
            "{op} special values {s}: {out:?} vs {want:?}"
        );
    }
    let bin: Binary<T> = e.kernel(&format!("binary_{s}"));
    let pairs: [(&[usize], &[usize]); 5] =
        [(&[2, 3, 4], &[3, 1]), (&[4, 1], &[1, 5]), (&[5], &[2, 5]), (&[], &[3]), (&[6, 7], &[6, 7])];
    for (sa, sb) in pairs {
        let a = arr::<T>(sa, 2, 0.125);
        let b = arr::<T>(sb, 3, 0.25).mapv(|v| if v == T::zero() { T::of_f64(0.5) } else { v });
        for op in BINARY_OPS {
            let want = cpu(Storage::Cpu(a.clone()).binary(op, &Storage::Cpu(b.clone())).unwrap());
            let g = args::broadcast(op.name(), want.shape(), sa, sb).unwrap();
            let mut out = zeros::<T>(want.shape());
            let (n, code) = (want.len() as u64, args::binary_code(op).unwrap());
            // SAFETY: the strides stay inside a and b (broadcast shapes).
            e.grid(4, || unsafe { bin(a.as_ptr(), b.as_ptr(), out.as_mut_ptr(), n, code, g) });
            assert!(same(&out, &want), "{op} {sa:?} {sb:?} {s}");
        }
    }
    // Ties and NaN on either side (comparisons are false with NaN but `ne`; maximum/minimum
    // propagate it).
    let v = |x: [f64; 6]| ArrayD::from_shape_vec(IxDyn(&[6]), x.map(T::of_f64).to_vec()).unwrap();
    let a = v([f64::NAN, 1.0, 2.0, f64::NAN, 3.0, -0.5]);
    let b = v([1.0, f64::NAN, 2.0, f64::NAN, -3.0, 0.5]);
    for op in BINARY_OPS {
        let want = cpu(Storage::Cpu(a.clone()).binary(op, &Storage::Cpu(b.clone())).unwrap());
        let g = args::broadcast(op.name(), &[6], &[6], &[6]).unwrap();
        let mut out = zeros::<T>(&[6]);
        let code = args::binary_code(op).unwrap();
        // SAFETY: 6 elements each.
        e.grid(2, || unsafe { bin(a.as_ptr(), b.as_ptr(), out.as_mut_ptr(), 6, code, g) });
        assert!(same(&out, &want), "{op} NaN/ties {s}: {out:?} vs {want:?}");
    }
}

/// Every binary op with a device kernel.
const BINARY_OPS: [BinaryOp; 12] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Eq,
    BinaryOp::Ne,
    BinaryOp::Lt,
    BinaryOp::Le,
    BinaryOp::Gt,
    BinaryOp::Ge,
    BinaryOp::Maximum,
    BinaryOp::Minimum,
];

fn reductions_and_softmax<T: Dev>(e: &Emu) {
    let s = sfx::<T>();
    let a = arr::<T>(&[3, 4, 5], 4, 1.0 / 3.0);
    let red: ReduceK<T> = e.kernel(&format!("reduce_{s}"));
    let dims: [&[usize]; 6] = [&[0], &[1], &[2], &[0, 2], &[0, 1, 2], &[]];
    for kind in [Reduction::Sum, Reduction::Mean, Reduction::Max, Reduction::Min] {
        for d in dims {
            for keep in [false, true] {
                let want = cpu(Storage::Cpu(a.clone()).reduce(kind, d, keep).unwrap());
                let (g, shape, nred) = args::reduce(kind.name(), a.shape(), d, keep).unwrap();
                assert_eq!(shape, want.shape());
                let (code, mean) = args::reduce_code(kind);
                let scale = T::a(1.0) / T::a(nred as f64);
                let mut out = zeros::<T>(&shape);
                let (nout, nr, m) = (out.len() as u64, nred as u64, i32::from(mean));
                // SAFETY: the reduce struct indexes inside a.
                e.grid(nout.min(5) as u32, || unsafe {
                    red(a.as_ptr(), out.as_mut_ptr(), nout, nr, code, m, scale, g)
                });
                assert!(close(&out, &want, T::TOL), "{kind:?} {d:?} keepdim {keep} {s}: {out:?} vs {want:?}");
            }
        }
    }
    let mut nan = a.clone();
    nan[[1, 2, 3]] = T::nan();
    for kind in [Reduction::Max, Reduction::Min] {
        let want = cpu(Storage::Cpu(nan.clone()).reduce(kind, &[2], false).unwrap());
        let (g, shape, nred) = args::reduce(kind.name(), nan.shape(), &[2], false).unwrap();
        let (code, _) = args::reduce_code(kind);
        let mut out = zeros::<T>(&shape);
        let nout = out.len() as u64;
        // SAFETY: as above.
        e.grid(2, || unsafe { red(nan.as_ptr(), out.as_mut_ptr(), nout, nred as u64, code, 0, T::a(1.0), g) });
        assert!(same(&out, &want) && out[[1, 2]].is_nan(), "{kind:?} NaN {s}");
    }
    let sm: Softmax<T> = e.kernel(&format!("softmax_{s}"));
    let smb: SoftmaxBwd<T> = e.kernel(&format!("softmax_bwd_{s}"));
    let g = arr::<T>(&[3, 4, 5], 7, 1.0 / 30.0);
    for dim in 0..3 {
        for kind in [SoftmaxKind::Softmax, SoftmaxKind::LogSoftmax] {
            let y = Storage::Cpu(a.clone()).softmax(dim, kind).unwrap();
            let gx = cpu(y.softmax_backward(&Storage::Cpu(g.clone()), dim, kind).unwrap());
            let (lanes, len, inner) = args::lanes(a.shape(), dim);
            let log = i32::from(kind == SoftmaxKind::LogSoftmax);
            let (mut out, mut back) = (zeros::<T>(a.shape()), zeros::<T>(a.shape()));
            // SAFETY: lanes·len elements.
            e.grid(3, || unsafe { sm(a.as_ptr(), out.as_mut_ptr(), lanes, len, inner, log) });
            assert!(close(&out, y.as_cpu().unwrap(), T::TOL), "{kind:?} dim {dim} {s}");
            // SAFETY: as above.
            e.grid(3, || unsafe { smb(out.as_ptr(), g.as_ptr(), back.as_mut_ptr(), lanes, len, inner, log) });
            assert!(close(&back, &gx, T::TOL), "{kind:?} backward dim {dim} {s}");
        }
    }
}

fn pack_embedding_random<T: Dev>(e: &Emu) {
    let s = sfx::<T>();
    let a = arr::<T>(&[5, 6, 7], 10, 1.0);
    let pk: Pack<T> = e.kernel(&format!("pack_{s}"));
    let run_plan = |plan: &pack::PackPlan, src: &ArrayD<T>| {
        let (table, total) = args::pack_table(plan).unwrap();
        let mut out = zeros::<T>(&plan.dst_shape);
        let nb = (table.len() / args::PACK_ROW) as u64;
        if total > 0 {
            // SAFETY: the checked plan stays inside both buffers.
            e.grid(3, || unsafe { pk(src.as_ptr(), out.as_mut_ptr(), table.as_ptr(), nb, total) });
        }
        out
    };
    let sa = Storage::Cpu(a.clone());
    let mut plans = vec![
        pack::permute(&[5, 6, 7], &[2, 0, 1]),
        pack::slice(&[5, 6, 7], &[1, 2, 3], &[3, 4, 2]),
        pack::broadcast(&[6, 1], &[5, 6, 7]).unwrap(),
    ];
    for (dim, parts) in [(0usize, 2usize), (1, 4), (2, 3), (0, 8)] {
        let mut block: Vec<usize> = vec![5, 6, 7];
        block[dim] = block[dim].div_ceil(parts);
        plans.push(pack::split(&[5, 6, 7], dim, parts, &block));
    }
    for plan in &plans {
        let src = if plan.src_len == 6 { arr::<T>(&[6, 1], 11, 1.0) } else { a.clone() };
        let want = cpu(Storage::Cpu(src.clone()).pack(plan).unwrap());
        assert!(same(&run_plan(plan, &src), &want), "plan {plan:?} {s}");
    }
    assert!(same(&run_plan(&pack::permute(&[5, 6, 7], &[1, 0, 2]), &a), &cpu(sa.transpose(0, 1).unwrap())));

    let table = arr::<T>(&[6, 5], 12, 1.0);
    let ids = ArrayD::from_shape_vec(IxDyn(&[2, 4]), vec![3i64, 0, 7, 3, 9, 2, 3, 8]).unwrap();
    let emb: Embed<T> = e.kernel(&format!("embedding_{s}"));
    let oh: OneHot<T> = e.kernel(&format!("one_hot_{s}"));
    let mut bad = 0i32;
    let mut out = zeros::<T>(&[2, 4, 5]);
    // SAFETY: 8 ids, 5 columns, a 6-row table.
    e.grid(3, || unsafe { emb(table.as_ptr(), ids.as_ptr(), out.as_mut_ptr(), 8, 5, 6, 2, 10, &mut bad) });
    let st = Storage::Cpu(table.clone());
    assert!(bad == 0 && same(&out, &cpu(st.embedding(&Storage::Cpu(ids.clone()), 2, 10).unwrap())), "embedding {s}");
    let g = arr::<T>(&[2, 4, 5], 13, 1.0 / 7.0);
    let gt = embedding_bwd(e, &g, &ids, &mut bad);
    let want = cpu(Storage::Cpu(g.clone()).embedding_backward(&Storage::Cpu(ids.clone()), 6, 2, 10).unwrap());
    assert!(bad == 0 && close(&gt, &want, T::TOL), "embedding_backward {s}");
    let mut o = zeros::<T>(&[2, 4, 10]);
    // SAFETY: 8 ids, 10 classes.
    e.grid(3, || unsafe { oh(ids.as_ptr(), o.as_mut_ptr(), 8, 10, &mut bad) });
    assert!(bad == 0 && same(&o, &cpu(Storage::Cpu(ids.clone()).one_hot::<T>(10).unwrap())), "one_hot {s}");
    for v in [-1i64, 10, i64::MIN, i64::MAX, 1 << 40] {
        let one = [v];
        let mut o = zeros::<T>(&[10]);
        let mut flag = 0i32;
        // SAFETY: one id, 10 classes.
        e.grid(1, || unsafe { oh(one.as_ptr(), o.as_mut_ptr(), 1, 10, &mut flag) });
        assert_eq!(flag, 1, "id {v} is flagged");
    }
    ids_past_float_exactness::<T>(e);

    let rnd: Random<T> = e.kernel(&format!("random_{s}"));
    for dist in [Distribution::Uniform, Distribution::Normal] {
        let fill = RandomFill { seed: 99, offset: (1 << 32) - 2, dist };
        let (global, off, shape) = ([9usize, 11], [2usize, 3], [5usize, 7]);
        let want = cpu(Storage::<T>::random(&Target::Cpu, &fill, &global, &off, &shape).unwrap());
        let (g, base) = args::random(&global, &off, &shape).unwrap();
        let k = rand_philox::splitmix64(fill.seed);
        let normal = i32::from(dist == Distribution::Normal);
        let mut out = zeros::<T>(&shape);
        // SAFETY: 35 elements.
        e.grid(4, || unsafe { rnd(out.as_mut_ptr(), 35, g, base, k as u32, (k >> 32) as u32, fill.offset, normal) });
        assert!(same(&out, &want), "random {dist:?} {s}");
    }
}

/// Issue 33: ids are i64 in the kernels, so ids past the integers a float holds (257 in bf16,
/// 2049 in f16, 2^24 + 1 in f32) reach their own rows. A 6-row shard at row 2^24 - 2 of a
/// vocabulary of 2^25 (no table that large is needed), its ids around 2^24 and the 16-bit
/// limits: the embedding and one-hot kernels against the host and against the rows and
/// classes the ids name.
fn ids_past_float_exactness<T: Dev>(e: &Emu) {
    let s = sfx::<T>();
    let (row0, vocab) = ((1i64 << 24) - 2, 1u64 << 25);
    let table = arr::<T>(&[6, 3], 14, 1.0);
    let idv = vec![row0 + 3, row0 + 1, 257, row0 + 5, 2049, row0 + 2, (1 << 24) + 1, row0];
    let ids = ArrayD::from_shape_vec(IxDyn(&[8]), idv.clone()).unwrap();
    let emb: Embed<T> = e.kernel(&format!("embedding_{s}"));
    let mut bad = 0i32;
    let mut out = zeros::<T>(&[8, 3]);
    // SAFETY: 8 ids, 3 columns, a 6-row shard.
    e.grid(3, || unsafe { emb(table.as_ptr(), ids.as_ptr(), out.as_mut_ptr(), 8, 3, 6, row0 as u64, vocab, &mut bad) });
    let host =
        cpu(Storage::Cpu(table.clone()).embedding(&Storage::Cpu(ids.clone()), row0 as usize, vocab as usize).unwrap());
    assert!(bad == 0 && same(&out, &host), "embedding past float exactness {s}");
    for (k, &id) in idv.iter().enumerate() {
        let r = id - row0;
        for c in 0..3 {
            let want = if (0..6).contains(&r) { table[[r as usize, c]] } else { T::zero() };
            assert!(out[[k, c]] == want, "id {id} column {c} {s}");
        }
    }
    // One-hot of ids around 2^11 and 2^8 into 2100 classes: the one sits at the id itself.
    let small = ArrayD::from_shape_vec(IxDyn(&[4]), vec![257i64, 2049, 2047, 255]).unwrap();
    let oh: OneHot<T> = e.kernel(&format!("one_hot_{s}"));
    let mut o = zeros::<T>(&[4, 2100]);
    // SAFETY: 4 ids, 2100 classes.
    e.grid(3, || unsafe { oh(small.as_ptr(), o.as_mut_ptr(), 4, 2100, &mut bad) });
    assert!(bad == 0 && same(&o, &cpu(Storage::Cpu(small.clone()).one_hot::<T>(2100).unwrap())), "one_hot {s}");
    for (k, &id) in small.iter().enumerate() {
        let row = o.index_axis(dtensor_runtime::ndarray::Axis(0), k);
        assert_eq!(row.iter().position(|&v| v == T::one()), Some(id as usize), "one_hot id {id} {s}");
    }
}

/// The device's embedding backward of the 8 ids into a 6-row shard at row 2 of a vocab of 10:
/// the atomic kernel for f32 and f64; for the 16-bit floats the same steps as
/// `CudaStorage::embedding_backward`, which widens the gradient (not the ids) to f32 around it.
fn embedding_bwd<T: Dev>(e: &Emu, g: &ArrayD<T>, ids: &ArrayD<i64>, bad: &mut i32) -> ArrayD<T> {
    let s = sfx::<T>();
    if !T::DTYPE.is_half() {
        let embb: Embed<T> = e.kernel(&format!("embedding_bwd_{s}"));
        let mut gt = zeros::<T>(&[6, 5]);
        // SAFETY: 8 ids, 5 columns, a 6-row shard.
        e.grid(3, || unsafe { embb(g.as_ptr(), ids.as_ptr(), gt.as_mut_ptr(), 8, 5, 6, 2, 10, bad) });
        return gt;
    }
    let widen = |a: &ArrayD<T>| {
        let k: Cast<T, f32> = e.kernel(&format!("cast_{s}_f32"));
        let mut o = zeros::<f32>(a.shape());
        // SAFETY: as many elements each.
        e.grid(2, || unsafe { k(a.as_ptr(), o.as_mut_ptr(), a.len() as u64) });
        o
    };
    let g32 = widen(g);
    let embb: Embed<f32> = e.kernel("embedding_bwd_f32");
    let mut gt = zeros::<f32>(&[6, 5]);
    // SAFETY: 8 ids, 5 columns, a 6-row shard.
    e.grid(3, || unsafe { embb(g32.as_ptr(), ids.as_ptr(), gt.as_mut_ptr(), 8, 5, 6, 2, 10, bad) });
    let round: Cast<f32, T> = e.kernel(&format!("cast_f32_{s}"));
    let mut out = zeros::<T>(&[6, 5]);
    // SAFETY: 30 elements each.
    e.grid(2, || unsafe { round(gt.as_ptr(), out.as_mut_ptr(), 30) });
    out
}

fn optimizers_cast_fill<T: Dev>(e: &Emu) {
    let s = sfx::<T>();
    let w0 = arr::<T>(&[4, 6], 15, 0.1);
    let g = arr::<T>(&[4, 6], 16, 0.05);
    let sgd: SgdK<T> = e.kernel(&format!("sgd_{s}"));
    let sgdm: SgdMomentum<T> = e.kernel(&format!("sgd_momentum_{s}"));
    let adamw: AdamWK<T> = e.kernel(&format!("adamw_{s}"));
    let (mut hw, mut w) = (Storage::Cpu(w0.clone()), w0.clone());
    let mut hb = Storage::Cpu(zeros::<T>(&[4, 6]));
    let mut b = zeros::<T>(&[4, 6]);
    let hg = Storage::Cpu(g.clone());
    for st in [
        SgdStep { lr: 0.1, momentum: 0.0, weight_decay: 0.01, first: true },
        SgdStep { lr: 0.05, momentum: 0.9, weight_decay: 0.01, first: true },
        SgdStep { lr: 0.05, momentum: 0.9, weight_decay: 0.0, first: false },
    ] {
        let (lr, m, wd) = (T::a(st.lr), T::a(st.momentum), T::a(st.weight_decay));
        if st.momentum == 0.0 {
            hw.sgd_step(&hg, None, &st).unwrap();
            // SAFETY: 24 elements each.
            e.grid(2, || unsafe { sgd(w.as_mut_ptr(), g.as_ptr(), 24, lr, wd) });
        } else {
            hw.sgd_step(&hg, Some(&mut hb), &st).unwrap();
            let first = i32::from(st.first);
            // SAFETY: 24 elements each.
            e.grid(2, || unsafe { sgdm(w.as_mut_ptr(), g.as_ptr(), b.as_mut_ptr(), 24, lr, m, wd, first) });
        }
        assert!(same(&w, hw.as_cpu().unwrap()), "sgd {st:?} {s}");
    }
    let (mut hm, mut hv) = (Storage::Cpu(zeros::<T>(&[4, 6])), Storage::Cpu(zeros::<T>(&[4, 6])));
    let (mut m, mut v) = (zeros::<T>(&[4, 6]), zeros::<T>(&[4, 6]));
    for t in 1..=3 {
        let p = adamw_step_at(t);
        hw.adamw_step(&hg, &mut hm, &mut hv, &p).unwrap();
        let c = T::a;
        let (lr, b1, b2, eps, wd, c1, c2) = (
            c(p.lr),
            c(p.beta1),
            c(p.beta2),
            c(p.eps),
            c(p.weight_decay),
            c(p.bias_correction1),
            c(p.bias_correction2),
        );
        // SAFETY: 24 elements each.
        e.grid(2, || unsafe {
            adamw(w.as_mut_ptr(), g.as_ptr(), m.as_mut_ptr(), v.as_mut_ptr(), 24, lr, b1, b2, eps, wd, c1, c2)
        });
        assert!(same(&w, hw.as_cpu().unwrap()) && same(&v, hv.as_cpu().unwrap()), "adamw step {t} {s}");
    }
    let fill: Fill<T> = e.kernel(&format!("fill_{s}"));
    let mut f = zeros::<T>(&[3, 5]);
    // SAFETY: 15 elements.
    e.grid(2, || unsafe { fill(f.as_mut_ptr(), 15, T::of_f64(-2.5)) });
    assert_eq!(f, ArrayD::from_elem(IxDyn(&[3, 5]), T::of_f64(-2.5)));
}

/// Ids (`i64`, as every kernel reads them): `v` reshaped to `shape`.
fn ids(shape: &[usize], v: &[i64]) -> ArrayD<i64> {
    ArrayD::from_shape_vec(IxDyn(shape), v.to_vec()).unwrap()
}

/// Ids in `[0, n)` of `shape`, repeats included.
fn ids_below(shape: &[usize], n: usize, seed: u64) -> ArrayD<i64> {
    global(shape, seed).mapv(|v| (v + 48.0).rem_euclid(n.max(1) as f64) as i64)
}

fn where_tri_arg<T: Dev>(e: &Emu) -> usize {
    let s = sfx::<T>();
    let mut cases = 0;
    let wh: Where<T> = e.kernel(&format!("where_{s}"));
    let shapes: [(&[usize], &[usize], &[usize]); 5] = [
        (&[2, 3, 4], &[3, 1], &[4]),
        (&[4, 1], &[1, 5], &[]),
        (&[6], &[2, 6], &[2, 1]),
        (&[3, 5, 2], &[3, 5, 2], &[3, 5, 2]),
        (&[0, 3], &[3], &[1]),
    ];
    for (sc, sa, sb) in shapes {
        // A mask with zeros, ones, other non-zeros and NaN (non-zero, so it picks `a`).
        let mut c = arr::<T>(sc, 21, 1.0).mapv(|v| if v.as_f64().rem_euclid(3.0) == 0.0 { T::zero() } else { v });
        if let Some(x) = c.iter_mut().nth(1) {
            *x = T::nan();
        }
        let (a, b) = (arr::<T>(sa, 22, 0.5), arr::<T>(sb, 23, 0.25));
        let want = cpu(Storage::Cpu(c.clone()).where_(&Storage::Cpu(a.clone()), &Storage::Cpu(b.clone())).unwrap());
        let (g, h) = args::where_(want.shape(), sc, sa, sb).unwrap();
        let mut out = zeros::<T>(want.shape());
        let n = want.len() as u64;
        // SAFETY: the strides stay inside c, a and b (broadcast shapes).
        e.grid(3, || unsafe { wh(c.as_ptr(), a.as_ptr(), b.as_ptr(), out.as_mut_ptr(), n, g, h) });
        assert!(same(&out, &want), "where {sc:?} {sa:?} {sb:?} {s}");
        cases += 1;
    }
    let tri: Tri<T> = e.kernel(&format!("tri_{s}"));
    for shape in [&[5usize, 7][..], &[2, 3, 4], &[1, 6, 1], &[0, 4]] {
        let a = arr::<T>(shape, 24, 1.0);
        let nd = shape.len();
        for lower in [true, false] {
            for diagonal in [-2i64, 0, 1, 3] {
                for (row0, col0) in [(0usize, 0usize), (3, 2), (0, 4), (5, 0)] {
                    let want = cpu(Storage::Cpu(a.clone()).tri(lower, diagonal, row0, col0).unwrap());
                    let mut out = zeros::<T>(shape);
                    let (n, rows, cols) = (a.len() as u64, shape[nd - 2] as u64, shape[nd - 1] as u64);
                    let (lo, r0, c0) = (i32::from(lower), row0 as i64, col0 as i64);
                    if n > 0 {
                        // SAFETY: n elements each.
                        e.grid(3, || unsafe { tri(a.as_ptr(), out.as_mut_ptr(), n, rows, cols, lo, diagonal, r0, c0) });
                    }
                    assert!(same(&out, &want), "tri {shape:?} lower {lower} diag {diagonal} at ({row0}, {col0}) {s}");
                    cases += 1;
                }
            }
        }
    }
    let ar: ArgReduce<T> = e.kernel(&format!("arg_reduce_{s}"));
    // Coarse values, so every lane has ties; then NaN in one lane.
    let mut a = arr::<T>(&[3, 4, 5], 25, 1.0 / 16.0).mapv(|v| T::of_f64(v.as_f64().floor()));
    for nan in [false, true] {
        if nan {
            a[[1, 2, 3]] = T::nan();
            a[[2, 0, 0]] = T::nan();
        }
        for dim in 0..3 {
            for max in [true, false] {
                for keep in [false, true] {
                    let want = Storage::Cpu(a.clone()).arg_reduce(dim, max, keep).unwrap().into_host().unwrap();
                    let (lanes, len, inner) = args::lanes(a.shape(), dim);
                    let mut out = ArrayD::<i64>::zeros(want.raw_dim());
                    // SAFETY: lanes·len elements in, lanes out.
                    e.grid(3, || unsafe { ar(a.as_ptr(), out.as_mut_ptr(), lanes, len, inner, i32::from(max)) });
                    assert_eq!(out, want, "arg_reduce dim {dim} max {max} keepdim {keep} nan {nan} {s}");
                    cases += 1;
                }
            }
        }
    }
    // Issue 33: indices past the integers a 16-bit float holds (an odd index above 256 in
    // bf16, above 2048 in f16) come back exact, as i64.
    for (len, at) in [(300usize, 257usize), (300, 299), (2100, 2049)] {
        let mut a = ArrayD::from_elem(IxDyn(&[2, len]), T::zero());
        a[[0, at]] = T::one();
        a[[1, at]] = -T::one();
        let mut out = ArrayD::<i64>::zeros(IxDyn(&[2]));
        for max in [true, false] {
            // SAFETY: 2 lanes of len elements in, 2 out.
            e.grid(2, || unsafe { ar(a.as_ptr(), out.as_mut_ptr(), 2, len as u64, 1, i32::from(max)) });
            let want = Storage::Cpu(a.clone()).arg_reduce(1, max, false).unwrap().into_host().unwrap();
            assert_eq!(out, want, "arg_reduce over {len} max {max} {s}");
            assert_eq!(out[[usize::from(!max)]], at as i64, "argmax/argmin index {at} of {len} {s}");
            cases += 1;
        }
    }
    cases
}

/// The `cat` kernel run part by part into one output, and the host's concatenation: (kernel, host).
fn cat_kernel<T: Scalar>(e: &Emu, ck: CatK<T>, parts: &[ArrayD<T>], dim: usize) -> (ArrayD<T>, ArrayD<T>) {
    let st: Vec<Storage<T>> = parts.iter().map(|p| Storage::Cpu(p.clone())).collect();
    let want = Storage::cat(&st.iter().collect::<Vec<_>>(), dim).unwrap().into_host().unwrap();
    let total = want.shape()[dim];
    let mut out = ArrayD::<T>::zeros(want.raw_dim());
    let mut start = 0;
    for p in parts {
        let (width, stride, offset) = args::cat_part(p.shape(), dim, total, start);
        start += p.shape()[dim];
        let n = p.len() as u64;
        if n > 0 {
            // SAFETY: the part's rows land inside out.
            e.grid(3, || unsafe { ck(p.as_ptr(), out.as_mut_ptr(), n, width, stride, offset) });
        }
    }
    (out, want)
}

fn cat_index_gather<T: Dev>(e: &Emu) -> usize {
    let s = sfx::<T>();
    let mut cases = 0;
    let ck: CatK<T> = e.kernel(&format!("cat_{s}"));
    for dim in 0..3 {
        // Uneven parts, an empty one among them.
        let shapes = cat_shapes(&[2, 3, 4], dim, &[3, 0, 1, 2]);
        let parts: Vec<ArrayD<T>> = shapes.iter().enumerate().map(|(i, sh)| arr::<T>(sh, 30 + i as u64, 1.0)).collect();
        let (out, want) = cat_kernel(e, ck, &parts, dim);
        assert!(same(&out, &want), "cat dim {dim} {s}");
        cases += 1;
    }

    let chk: CheckIds = e.kernel("check_ids_i64");
    for (v, ok) in [(0i64, true), (4, true), (-1, false), (5, false), (i64::MIN, false), (i64::MAX, false)] {
        let one = [0, v, 0];
        let mut bad = 0i32;
        // SAFETY: 3 ids.
        e.grid(2, || unsafe { chk(one.as_ptr(), 3, 5, &mut bad) });
        assert_eq!(bad == 0, ok, "id {v} below 5 {s}");
        let host = Storage::Cpu(arr::<T>(&[5, 2], 1, 1.0)).index_select(0, &Storage::Cpu(ids(&[3], &[0, v, 0])));
        assert_eq!(host.is_ok(), ok, "the host agrees on id {v}");
        cases += 1;
    }

    let sel: IndexK<T> = e.kernel(&format!("index_select_{s}"));
    let add: IndexK<T> = e.kernel(&format!("index_add_{s}"));
    let a = arr::<T>(&[4, 5, 3], 40, 1.0 / 7.0);
    for dim in 0..3 {
        let len = a.shape()[dim];
        for nids in [0usize, 1, 7] {
            let i = ids_below(&[nids], len, 41 + dim as u64);
            let want = cpu(Storage::Cpu(a.clone()).index_select(dim, &Storage::Cpu(i.clone())).unwrap());
            let (_, l, inner) = args::along(a.shape(), dim);
            let mut out = zeros::<T>(want.shape());
            let n = want.len() as u64;
            if n > 0 {
                // SAFETY: checked ids index inside a.
                e.grid(3, || unsafe { sel(a.as_ptr(), i.as_ptr(), out.as_mut_ptr(), n, l, nids as u64, inner) });
            }
            assert!(same(&out, &want), "index_select dim {dim} {nids} ids {s}");
            // Its gradient, into a dim of size len + 1 (a row no id names stays zero).
            let g = arr::<T>(want.shape(), 42, 1.0 / 3.0);
            let back = cpu(Storage::Cpu(g.clone()).index_add(dim, &Storage::Cpu(i.clone()), len + 1).unwrap());
            let (_, _, inner) = args::along(g.shape(), dim);
            let mut out = zeros::<T>(back.shape());
            let n = back.len() as u64;
            // SAFETY: checked ids index inside out; g has nids slices.
            e.grid(3, || unsafe {
                add(g.as_ptr(), i.as_ptr(), out.as_mut_ptr(), n, len as u64 + 1, nids as u64, inner)
            });
            assert!(same(&out, &back), "index_add dim {dim} {nids} ids {s}");
            cases += 2;
        }
    }

    let ga: GatherK<T> = e.kernel(&format!("gather_{s}"));
    let sa: GatherK<T> = e.kernel(&format!("scatter_add_{s}"));
    for dim in 0..3 {
        // Index shapes no larger than a's in the other dims, longer or empty along dim.
        for ishape in [[3usize, 6, 2], [4, 2, 3], [2, 0, 3], [1, 1, 1]] {
            let mut ishape = ishape.to_vec();
            ishape.swap(1, dim);
            let i = ids_below(&ishape, a.shape()[dim], 50 + dim as u64);
            let want = cpu(Storage::Cpu(a.clone()).gather(dim, &Storage::Cpu(i.clone())).unwrap());
            let g = args::gather("gather", &ishape, a.shape(), dim).unwrap();
            let mut out = zeros::<T>(&ishape);
            let n = out.len() as u64;
            let len = a.shape()[dim] as u64;
            if n > 0 {
                // SAFETY: checked ids index inside a.
                e.grid(3, || unsafe { ga(a.as_ptr(), i.as_ptr(), out.as_mut_ptr(), n, len, g) });
            }
            assert!(same(&out, &want), "gather dim {dim} ids {ishape:?} {s}");
            let gr = arr::<T>(&ishape, 51, 1.0 / 5.0);
            let back = cpu(Storage::Cpu(gr.clone()).scatter_add(dim, &Storage::Cpu(i.clone()), a.shape()).unwrap());
            let g = args::gather("gather_backward", a.shape(), &ishape, dim).unwrap();
            let mut out = zeros::<T>(a.shape());
            let n = out.len() as u64;
            // SAFETY: the lanes read stay inside gr and ids (bounds checked in the kernel).
            e.grid(3, || unsafe { sa(gr.as_ptr(), i.as_ptr(), out.as_mut_ptr(), n, len, g) });
            assert!(same(&out, &back), "scatter_add dim {dim} ids {ishape:?} {s}");
            cases += 2;
        }
    }
    cases
}

/// The copy kernels (fill, pack, cat, index_select, gather) of a dtype against the host: bit
/// for bit.
fn copies<T: Scalar>(e: &Emu) -> usize {
    let s = T::DTYPE.to_string();
    let v = |shape: &[usize], seed: u64| global(shape, seed).mapv(|x| T::of_f64(x + 48.0));
    let mut cases = 0;
    let a = v(&[5, 6, 7], 60);
    let pk: Pack<T> = e.kernel(&format!("pack_{s}"));
    let mut plans = vec![
        pack::permute(&[5, 6, 7], &[2, 0, 1]),
        pack::slice(&[5, 6, 7], &[1, 2, 3], &[3, 4, 2]),
        pack::pad(&[5, 6, 7], &[6, 8, 7], &[1, 1, 0]),
    ];
    for (dim, parts) in [(0usize, 2usize), (1, 4), (2, 3), (0, 8)] {
        let mut block: Vec<usize> = vec![5, 6, 7];
        block[dim] = block[dim].div_ceil(parts);
        plans.push(pack::split(&[5, 6, 7], dim, parts, &block));
    }
    for plan in &plans {
        let want = Storage::Cpu(a.clone()).pack(plan).unwrap().into_host().unwrap();
        let (table, total) = args::pack_table(plan).unwrap();
        let mut out = ArrayD::<T>::zeros(IxDyn(&plan.dst_shape));
        let nb = (table.len() / args::PACK_ROW) as u64;
        if total > 0 {
            // SAFETY: the checked plan stays inside both buffers.
            e.grid(3, || unsafe { pk(a.as_ptr(), out.as_mut_ptr(), table.as_ptr(), nb, total) });
        }
        assert_eq!(out, want, "pack {plan:?} {s}");
        cases += 1;
    }
    let ck: CatK<T> = e.kernel(&format!("cat_{s}"));
    for dim in 0..3 {
        let parts: Vec<ArrayD<T>> =
            cat_shapes(&[2, 3, 4], dim, &[3, 0, 2]).iter().map(|sh| v(sh, 61 + sh[dim] as u64)).collect();
        let (out, want) = cat_kernel(e, ck, &parts, dim);
        assert_eq!(out, want, "cat dim {dim} {s}");
        cases += 1;
    }
    // index_select and gather only move elements: every dtype has them, at i64 ids.
    let a = v(&[4, 5, 3], 62);
    let sel: IndexK<T> = e.kernel(&format!("index_select_{s}"));
    let ga: GatherK<T> = e.kernel(&format!("gather_{s}"));
    for dim in 0..3 {
        let len = a.shape()[dim];
        let i = ids_below(&[7], len, 63 + dim as u64);
        let want = Storage::Cpu(a.clone()).index_select(dim, &Storage::Cpu(i.clone())).unwrap().into_host().unwrap();
        let (_, l, inner) = args::along(a.shape(), dim);
        let mut out = ArrayD::<T>::zeros(want.raw_dim());
        let n = want.len() as u64;
        // SAFETY: in-range ids index inside a.
        e.grid(3, || unsafe { sel(a.as_ptr(), i.as_ptr(), out.as_mut_ptr(), n, l, 7, inner) });
        assert_eq!(out, want, "index_select dim {dim} {s}");
        let mut ishape = vec![3usize, 6, 2];
        ishape.swap(1, dim);
        let i = ids_below(&ishape, len, 64 + dim as u64);
        let want = Storage::Cpu(a.clone()).gather(dim, &Storage::Cpu(i.clone())).unwrap().into_host().unwrap();
        let g = args::gather("gather", &ishape, a.shape(), dim).unwrap();
        let mut out = ArrayD::<T>::zeros(want.raw_dim());
        let n = want.len() as u64;
        // SAFETY: in-range ids index inside a.
        e.grid(3, || unsafe { ga(a.as_ptr(), i.as_ptr(), out.as_mut_ptr(), n, len as u64, g) });
        assert_eq!(out, want, "gather dim {dim} {s}");
        cases += 2;
    }
    let fill: Fill<T> = e.kernel(&format!("fill_{s}"));
    let mut f = ArrayD::<T>::zeros(IxDyn(&[3, 5]));
    // SAFETY: 15 elements.
    e.grid(2, || unsafe { fill(f.as_mut_ptr(), 15, T::of_f64(7.0)) });
    assert_eq!(f, Storage::full(&Target::Cpu, &[3, 5], T::of_f64(7.0)).unwrap().into_host().unwrap(), "fill {s}");
    cases + 1
}

#[test]
fn copy_kernels_of_every_dtype_match_the_host() {
    let Some(e) = Emu::build() else { return };
    let cases = copies::<f32>(&e)
        + copies::<f64>(&e)
        + copies::<dtensor_runtime::bf16>(&e)
        + copies::<dtensor_runtime::f16>(&e)
        + copies::<i64>(&e)
        + copies::<i32>(&e)
        + copies::<u8>(&e);
    println!("{cases} fill/pack/cat/index_select/gather cases of 7 dtypes match the host");
}

/// The element-wise kernels of a 16-bit float against the host: every one of the 65536 bit
/// patterns through the exact ops (so every conversion and rounding case), bit for bit; the
/// transcendental ones within a rounding step of the type; the binary ops with broadcasting.
fn half_elementwise<T: Dev>(e: &Emu, from_bits: fn(u16) -> T) -> usize {
    let s = sfx::<T>();
    let mut cases = 0;
    let all = ArrayD::from_shape_vec(IxDyn(&[256, 256]), (0..=u16::MAX).map(from_bits).collect()).unwrap();
    let un: Unary<T> = e.kernel(&format!("unary_{s}"));
    let x = arr::<T>(&[5, 7], 1, 1.0 / 12.0);
    let exact = [
        UnaryOp::MulScalar(1.0),
        UnaryOp::MulScalar(1.0 + 1.0 / 3.0),
        UnaryOp::MulScalar(1e-3),
        UnaryOp::MulScalar(300.0),
        UnaryOp::AddScalar(0.1),
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Relu,
        UnaryOp::Sign,
        UnaryOp::Clamp { lo: -0.25, hi: 0.5 },
        UnaryOp::Sqrt,
        UnaryOp::DropoutScale(0.3),
    ];
    for (op, input, tol) in exact.iter().map(|&op| (op, &all, 0.0)).chain(
        [UnaryOp::Exp, UnaryOp::Gelu, UnaryOp::Tanh, UnaryOp::Silu, UnaryOp::GeluErf, UnaryOp::Sigmoid]
            .iter()
            .map(|&op| (op, &x, T::TOL)),
    ) {
        let want = cpu(Storage::Cpu(input.clone()).unary(op).unwrap());
        let mut out = zeros::<T>(input.shape());
        let (n, code) = (input.len() as u64, args::unary_code(op).unwrap());
        let (sc, tc) = args::unary_scalars(op);
        // SAFETY: buffers of n elements.
        e.grid(3, || unsafe { un(input.as_ptr(), out.as_mut_ptr(), n, code, T::a(sc), T::a(tc)) });
        if tol == 0.0 {
            assert!(same(&out, &want), "{op} {s} over every bit pattern");
        } else {
            assert!(close(&out, &want, tol), "{op} {s}: {out:?} vs {want:?}");
        }
        cases += 1;
    }
    let bin: Binary<T> = e.kernel(&format!("binary_{s}"));
    let pairs: [(&[usize], &[usize]); 3] = [(&[2, 3, 4], &[3, 1]), (&[4, 1], &[1, 5]), (&[256, 256], &[256])];
    for (sa, sb) in pairs {
        let a = if sa == [256, 256] { all.clone() } else { arr::<T>(sa, 2, 0.125) };
        let b = arr::<T>(sb, 3, 0.25).mapv(|v| if v == T::zero() { T::of_f64(0.5) } else { v });
        for op in BINARY_OPS {
            let want = cpu(Storage::Cpu(a.clone()).binary(op, &Storage::Cpu(b.clone())).unwrap());
            let g = args::broadcast(op.name(), want.shape(), sa, sb).unwrap();
            let mut out = zeros::<T>(want.shape());
            let (n, code) = (want.len() as u64, args::binary_code(op).unwrap());
            // SAFETY: the strides stay inside a and b (broadcast shapes).
            e.grid(4, || unsafe { bin(a.as_ptr(), b.as_ptr(), out.as_mut_ptr(), n, code, g) });
            assert!(same(&out, &want), "{op} {sa:?} {sb:?} {s}");
            cases += 1;
        }
    }
    cases
}

#[test]
fn half_float_elementwise_kernels_match_the_host() {
    let Some(e) = Emu::build() else { return };
    let cases = half_elementwise::<dtensor_runtime::bf16>(&e, dtensor_runtime::bf16::from_bits)
        + half_elementwise::<dtensor_runtime::f16>(&e, dtensor_runtime::f16::from_bits);
    println!("{cases} bf16/f16 unary and binary cases match the host");
}

/// `cast_<A>_<B>` of `a` against the host's cast.
fn cast_case<A: Scalar, B: Scalar>(e: &Emu, a: &ArrayD<A>) {
    let k: Cast<A, B> = e.kernel(&format!("cast_{}_{}", A::DTYPE, B::DTYPE));
    let want = Storage::Cpu(a.clone()).cast::<B>().unwrap().into_host().unwrap();
    let mut out = ArrayD::<B>::zeros(a.raw_dim());
    let n = a.len() as u64;
    // SAFETY: n elements each.
    e.grid(3, || unsafe { k(a.as_ptr(), out.as_mut_ptr(), n) });
    // Bit for bit, but any NaN for a NaN: NaN payloads are not portable (a GPU makes its own).
    let nan = |x: &B| x.as_f64().is_nan();
    let differs = |(x, y): (&B, &B)| bytemuck::bytes_of(x) != bytemuck::bytes_of(y) && !(nan(x) && nan(y));
    let at = out.iter().zip(&want).position(differs);
    assert!(
        at.is_none(),
        "cast {} -> {} differs at {at:?}: {} from {} (host {})",
        A::DTYPE,
        B::DTYPE,
        at.map(|i| out.as_slice().unwrap()[i].to_string()).unwrap_or_default(),
        at.map(|i| a.as_slice().unwrap()[i].to_string()).unwrap_or_default(),
        at.map(|i| want.as_slice().unwrap()[i].to_string()).unwrap_or_default(),
    );
}

/// Every cast from the four floats: all 65536 patterns of each 16-bit type, and f32/f64
/// values at and around every rounding point of the 16-bit types (ties, subnormals, overflow,
/// NaN, infinities).
#[test]
fn float_casts_match_the_host() {
    use dtensor_runtime::{bf16, f16};
    let Some(e) = Emu::build() else { return };
    let b = ArrayD::from_shape_vec(IxDyn(&[65536]), (0..=u16::MAX).map(bf16::from_bits).collect()).unwrap();
    let h = ArrayD::from_shape_vec(IxDyn(&[65536]), (0..=u16::MAX).map(f16::from_bits).collect()).unwrap();
    // Every high half with low halves at bf16's rounding points, and every f16 pattern widened
    // with the f32 bits around f16's rounding point (bit 12) set.
    let mut w: Vec<u32> = Vec::new();
    for hi in 0..=u16::MAX as u32 {
        w.extend([0u32, 1, 0x7fff, 0x8000, 0x8001, 0xffff].map(|lo| (hi << 16) | lo));
    }
    for p in 0..=u16::MAX {
        let x = f16::from_bits(p).to_f32().to_bits();
        w.extend([x, x | 0x1000, x | 0x0fff, x | 0x1001, x ^ 0x1000]);
    }
    let f = ArrayD::from_shape_vec(IxDyn(&[w.len()]), w.iter().map(|&x| f32::from_bits(x)).collect()).unwrap();
    // f64 values just off f32 values: they round to f32 first, then to the 16-bit type.
    let d = f.mapv(|x| f64::from(x) * (1.0 + 1e-12));
    let n = casts_from(&e, &b) + casts_from(&e, &h) + casts_from(&e, &f) + casts_from(&e, &d);
    println!(
        "{n} casts from f32, f64, bf16, f16 to every dtype bit-exact (NaN payloads aside) over {} values",
        2 * 65536 + 2 * w.len()
    );
}

#[test]
fn indexing_kernels_match_the_host_kernels() {
    let Some(e) = Emu::build() else { return };
    let cases =
        where_tri_arg::<f64>(&e) + where_tri_arg::<f32>(&e) + cat_index_gather::<f64>(&e) + cat_index_gather::<f32>(&e);
    println!("{cases} where/tri/arg_reduce/cat/index_select/index_add/gather/scatter_add cases match the host");
}

/// The element-wise, reduction, softmax, pack, embedding, random and optimizer cases of a float.
fn arithmetic<T: Dev>(e: &Emu) {
    elementwise::<T>(e);
    reductions_and_softmax::<T>(e);
    pack_embedding_random::<T>(e);
    optimizers_cast_fill::<T>(e);
}

#[test]
fn kernel_source_matches_the_host_kernels() {
    let Some(e) = Emu::build() else { return };
    arithmetic::<f64>(&e);
    arithmetic::<f32>(&e);
    let x = arr::<f64>(&[7, 3], 20, 1.0 / 3.0 + 1e-9);
    let to32: Cast<f64, f32> = e.kernel("cast_f64_f32");
    let mut y = zeros::<f32>(&[7, 3]);
    // SAFETY: 21 elements.
    e.grid(2, || unsafe { to32(x.as_ptr(), y.as_mut_ptr(), 21) });
    assert!(same(&y, &cpu(Storage::Cpu(x.clone()).cast::<f32>().unwrap())));
    let to64: Cast<f32, f64> = e.kernel("cast_f32_f64");
    let mut z = zeros::<f64>(&[7, 3]);
    // SAFETY: 21 elements.
    e.grid(2, || unsafe { to64(y.as_ptr(), z.as_mut_ptr(), 21) });
    assert!(same(&z, &y.mapv(f64::from)));
}

/// `cast_<A>_<B>` for `A` into every dtype.
fn casts_from<A: Scalar>(e: &Emu, a: &ArrayD<A>) -> usize {
    use dtensor_runtime::{bf16, f16};
    cast_case::<A, f32>(e, a);
    cast_case::<A, f64>(e, a);
    cast_case::<A, bf16>(e, a);
    cast_case::<A, f16>(e, a);
    cast_case::<A, i64>(e, a);
    cast_case::<A, i32>(e, a);
    cast_case::<A, u8>(e, a);
    7
}

/// Every cast from and to the integers, bit for bit against the host (Rust's `as`): floats at
/// and around every integer type's bounds (saturation), fractions of both signs (truncation),
/// NaN and infinities (0 and the bounds), beyond 2⁵³; integers at the bounds of every type
/// (wrapping), beyond 2²⁴ and 2⁵³ (rounding to the floats), and spread over the whole range.
#[test]
fn integer_casts_match_the_host() {
    use dtensor_runtime::{bf16, f16};
    let Some(e) = Emu::build() else { return };
    let p = |k: i32| 2f64.powi(k);
    let mut fv = vec![
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        0.5,
        -0.5,
        0.999,
        -0.999,
        1.5,
        -1.5,
        -1.0,
        127.5,
        128.0,
        254.9,
        255.0,
        255.5,
        256.0,
        -128.5,
        -129.0,
        65504.0,
        65520.0,
        p(24) + 1.0,
        p(31) - 1.0,
        p(31) - 0.5,
        p(31),
        p(31) + 1.0,
        -p(31),
        -p(31) - 1.0,
        -p(31) + 0.5,
        p(53) + 2.0,
        -p(53) - 2.0,
        p(63),
        -p(63),
        p(63) * (1.0 - f64::EPSILON),
        1e19,
        -1e19,
        1e30,
        -1e30,
        3.4e38,
        1e-40,
    ];
    fv.extend(global(&[200], 70).iter().map(|v| v * 1e3));
    fv.extend(global(&[200], 71).iter().map(|v| v * 1e8));
    let f64s = ArrayD::from_shape_vec(IxDyn(&[fv.len()]), fv.clone()).unwrap();
    let mut cases = casts_from::<f64>(&e, &f64s);
    cases += casts_from::<f32>(&e, &f64s.mapv(|v| v as f32));
    cases += casts_from::<bf16>(&e, &f64s.mapv(bf16::from_f64));
    cases += casts_from::<f16>(&e, &f64s.mapv(f16::from_f64));
    let mut iv: Vec<i64> = vec![0, 1, -1, 127, 128, 255, 256, -128, -129, -256, 65504, 65520];
    for b in [i32::MAX as i64, i32::MIN as i64, i64::MAX, i64::MIN, 1 << 24, 1 << 53, 1 << 62] {
        iv.extend([b.wrapping_sub(1), b, b.wrapping_add(1), b.wrapping_add(1).wrapping_neg()]);
    }
    // Spread over the whole range: every bit of a 64-bit word set at random.
    iv.extend((0..300u64).map(|k| rand_philox::splitmix64(k.wrapping_mul(0x9E37_79B9)) as i64));
    let ints = ArrayD::from_shape_vec(IxDyn(&[iv.len()]), iv).unwrap();
    cases += casts_from::<i64>(&e, &ints);
    cases += casts_from::<i32>(&e, &ints.mapv(|v| v as i32));
    cases += casts_from::<u8>(&e, &ints.mapv(|v| v as u8));
    println!("{cases} casts from every dtype to every dtype bit-exact (NaN payloads aside)");
}

/// The arithmetic kernels of the 16-bit floats (computed in f32, rounded once) against the
/// host's, on the same cases as f32 and f64: exact results bit for bit, the others within a
/// rounding step of the type.
#[test]
fn half_float_kernels_match_the_host() {
    use dtensor_runtime::{bf16, f16};
    let Some(e) = Emu::build() else { return };
    arithmetic::<bf16>(&e);
    arithmetic::<f16>(&e);
    let cases = where_tri_arg::<bf16>(&e)
        + where_tri_arg::<f16>(&e)
        + cat_index_gather::<bf16>(&e)
        + cat_index_gather::<f16>(&e);
    println!("elementwise/reduce/softmax/embedding/random/optimizers and {cases} indexing cases of bf16 and f16 match the host");
}
