//! The CUDA C source of every device kernel, as text: compiled at run time with NVRTC (no
//! CUDA toolkit at build time), and, for its random-number part, by the host C compiler in a
//! CPU test that checks it against [`crate::rng`] bit for bit.
//!
//! The kernels are written once and instantiated per dtype: the copy kernels ([`COPY_KERNELS`])
//! over `T` for every dtype, the arithmetic kernels ([`FLOAT_KERNELS`]) over a storage type `S`
//! and a compute type `T` for each row of [`FLOATS`] (the 16-bit floats load into f32 and round
//! once on store), the id check ([`ID_KERNELS`], once), and the casts between all dtypes from
//! the [`CASTS`] table. Kernels are named `name_<dtype>` (`reduce_bf16`). Ids (embedding,
//! one-hot, indexing) are `long long` (`i64`) in every kernel, whatever the element type, and
//! `argmax`/`argmin` write `long long` indices: an index never passes through a float, which
//! would round it (bf16 holds every integer only up to 256). Kernels take raw element
//! counts, a grid-stride loop covers any grid, and index arithmetic is 64-bit. Op codes are the
//! `code()` of the op enums (`op.rs`) and the `*_code` functions of `cuda/args.rs`, which the
//! `switch`es here must agree with (the device tests check every code against the host kernels).
//!
//! Compile every module with `--fmad=false`: then `a * b + c` rounds twice as on the host, the
//! optimizer updates and the Philox normals are bit-identical to the CPU path, and element-wise
//! arithmetic differs from it only through the math library (`exp`, `log`, `tanh`).
//!
//! Always compiled (it is only text), so the CPU tests can read it without the `cuda` feature.

use crate::op::{GELU_A, GELU_C, UNARY_CUDA_CASES};
use crate::rng::{LN2_HI, LN2_LO, LOG_TERMS, TRIG_TERMS};

/// The floats: (kernel name suffix, C storage type, C compute type, `LD(x)` widening a
/// stored element to the compute type, `ST(x)` rounding a computed value to the storage type).
/// f32 and f64 compute in themselves; the 16-bit floats are stored as their bits and compute
/// in f32, rounding once per result, as the host kernels do.
pub const FLOATS: [(&str, &str, &str, &str, &str); 4] = [
    ("f32", "float", "float", "(x)", "(x)"),
    ("f64", "double", "double", "(x)", "(x)"),
    ("bf16", "unsigned short", "float", "dt_bf16_to_f32(x)", "dt_f32_to_bf16(x)"),
    ("f16", "unsigned short", "float", "dt_f16_to_f32(x)", "dt_f32_to_f16(x)"),
];

/// The integers: (kernel name suffix, C type). They have the copy kernels (moves, including
/// `index_select` and `gather`) and the casts (every other op needs a float tensor, so an
/// integer tensor reaches no other kernel).
pub const INTS: [(&str, &str); 3] = [("i64", "long long"), ("i32", "int"), ("u8", "unsigned char")];

/// Most dims a strided kernel indexes (more is a typed error before launch).
pub const MAX_DIMS: usize = 8;

/// Threads per block of every launch (the block reductions assume this power of two).
pub const BLOCK: u32 = 256;

/// The kernels that only move elements (fills, pack plans, concatenation, selection at `i64`
/// ids): instantiated for every dtype, so every dtype redistributes, concatenates and is
/// indexed on a device.
pub const COPY_KERNELS: [&str; 5] = ["fill", "pack", "cat", "index_select", "gather"];

/// The kernels of the ids themselves, compiled once for their type, `i64` ([`ID_DTYPE`]).
pub const ID_KERNELS: [&str; 1] = ["check_ids"];

/// The suffix of [`ID_KERNELS`]: ids are `i64` on every device.
pub const ID_DTYPE: &str = "i64";

/// The arithmetic kernels of every float ([`FLOATS`]; base names, compiled as `name_<sfx>`).
pub const FLOAT_KERNELS: [&str; 16] = [
    "unary",
    "binary",
    "reduce",
    "softmax",
    "softmax_bwd",
    "embedding",
    "one_hot",
    "random",
    "sgd",
    "sgd_momentum",
    "adamw",
    "where",
    "tri",
    "arg_reduce",
    "index_add",
    "scatter_add",
];

/// The kernels that add with `atomicAdd`, so only for the floats with a native one (f32, f64):
/// the 16-bit floats widen to f32 around them (the host accumulates them in f32 too).
pub const ATOMIC_KERNELS: [&str; 1] = ["embedding_bwd"];

/// The floats with [`ATOMIC_KERNELS`].
pub const ATOMIC_DTYPES: [&str; 2] = ["f32", "f64"];

/// How `cast_<from>_<to>` converts, per dtype: (suffix, C type, whether an integer, `X`
/// widened to double (a float) or to long long (an integer), a double `X` converted to the
/// type, a long long `X` converted to the type). As the host's casts (Rust's `as`): from a
/// float through f64 (exact), to an integer truncating toward zero and saturating (NaN to 0);
/// from an integer through i64 (exact), to a narrower integer wrapping, to a float rounding to
/// nearest; to a 16-bit float through f32. A cast to the same type copies the bits.
pub const CASTS: [(&str, &str, bool, &str, &str, &str); 7] = [
    ("f32", "float", false, "(double)X", "(float)X", "(float)X"),
    ("f64", "double", false, "X", "X", "(double)X"),
    (
        "bf16",
        "unsigned short",
        false,
        "(double)dt_bf16_to_f32(X)",
        "dt_f32_to_bf16((float)X)",
        "dt_f32_to_bf16((float)X)",
    ),
    ("f16", "unsigned short", false, "(double)dt_f16_to_f32(X)", "dt_f32_to_f16((float)X)", "dt_f32_to_f16((float)X)"),
    ("i64", "long long", true, "(long long)X", "dt_f64_to_i64(X)", "(long long)X"),
    ("i32", "int", true, "(long long)X", "dt_f64_to_i32(X)", "(int)X"),
    ("u8", "unsigned char", true, "(long long)X", "dt_f64_to_u8(X)", "(unsigned char)X"),
];

/// Every compiled kernel name: the copy kernels of every dtype, the arithmetic kernels of the
/// floats, the atomic ones of f32/f64, the id kernels of i64, and the casts `cast_<from>_<to>`
/// between all dtypes.
pub fn kernel_names() -> Vec<String> {
    let mut names = Vec::new();
    for (sfx, ..) in CASTS {
        for k in COPY_KERNELS {
            names.push(format!("{k}_{sfx}"));
        }
    }
    for (sfx, ..) in FLOATS {
        for k in FLOAT_KERNELS {
            names.push(format!("{k}_{sfx}"));
        }
    }
    for sfx in ATOMIC_DTYPES {
        for k in ATOMIC_KERNELS {
            names.push(format!("{k}_{sfx}"));
        }
    }
    for k in ID_KERNELS {
        names.push(format!("{k}_{ID_DTYPE}"));
    }
    for (from, ..) in CASTS {
        for (to, ..) in CASTS {
            names.push(format!("cast_{from}_{to}"));
        }
    }
    names
}

/// Whether the module has kernel `name` for element type suffix `sfx` (`cast_<from>` for the
/// casts to `sfx`).
pub fn has_kernel(name: &str, sfx: &str) -> bool {
    let dtype = |t: &str| CASTS.iter().any(|c| c.0 == t);
    if let Some(from) = name.strip_prefix("cast_") {
        return dtype(from) && dtype(sfx);
    }
    (dtype(sfx) && COPY_KERNELS.contains(&name))
        || (FLOATS.iter().any(|f| f.0 == sfx) && FLOAT_KERNELS.contains(&name))
        || (ATOMIC_DTYPES.contains(&sfx) && ATOMIC_KERNELS.contains(&name))
        || (sfx == ID_DTYPE && ID_KERNELS.contains(&name))
}

/// The counter-based random numbers: Philox4x32-10 and the conversions to uniform and normal
/// numbers, in the C subset shared by CUDA and the host compiler (`DEV` marks functions:
/// `__device__` on the GPU, `static` on the host). Every operation is a correctly rounded
/// IEEE operation (`+ - * /`, `sqrt`, `floor`, `frexp`), so the results do not depend on a
/// math library: `crate::rng` computes the same steps in Rust.
pub const RNG_SOURCE: &str = r#"
/* Philox4x32-10 (Salmon et al. 2011) of counter c under key (k0, k1), in place. */
DEV void dt_philox(unsigned int c[4], unsigned int k0, unsigned int k1) {
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned long long p0 = (unsigned long long)0xD2511F53u * c[0];
        unsigned long long p1 = (unsigned long long)0xCD9E8D57u * c[2];
        unsigned int n0 = (unsigned int)(p1 >> 32) ^ c[1] ^ k0;
        unsigned int n1 = (unsigned int)p1;
        unsigned int n2 = (unsigned int)(p0 >> 32) ^ c[3] ^ k1;
        unsigned int n3 = (unsigned int)p0;
        c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
    }
}

/* (w + 0.5) * 2^-32: uniform in (0, 1), never 0 or 1. */
DEV double dt_unit(unsigned int w) { return ((double)w + 0.5) * (1.0 / 4294967296.0); }

/* ln x for x in (0, 1): x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(s),
   s = (m - 1) / (m + 1), as the series 2 s (1 + z/3 + z^2/5 + ...) with z = s^2. */
DEV double dt_log(double x) {
    int e;
    double m = frexp(x, &e);
    if (m < DT_SQRT_HALF) { m = m * 2.0; e = e - 1; }
    double s = (m - 1.0) / (m + 1.0);
    double z = s * s;
    double p = 2.0 / (2.0 * DT_LOG_TERMS - 1.0);
    for (int k = DT_LOG_TERMS - 2; k >= 0; --k) p = p * z + 2.0 / (2.0 * k + 1.0);
    /* ln 2 split so that e * hi is exact (fdlibm's ln2_hi / ln2_lo). */
    return (double)e * DT_LN2_HI + ((double)e * DT_LN2_LO + s * p);
}

/* sin and cos of 2 pi t for t in [0, 1): the quarter turn q nearest to 4t is exact, the rest
   a = (4t - q) pi/2 lies in [-pi/4, pi/4], where Taylor series with DT_TRIG_TERMS terms reach
   double precision. */
DEV void dt_sincos_turn(double t, double* sn, double* cs) {
    double r = t * 4.0;
    double q = floor(r + 0.5);
    double a = (r - q) * DT_HALF_PI;
    double z = a * a;
    double cs_coef[DT_TRIG_TERMS];
    double sn_coef[DT_TRIG_TERMS];
    double fs = 1.0, fc = 1.0;
    for (int k = 0; k < DT_TRIG_TERMS; ++k) {
        sn_coef[k] = fs;
        cs_coef[k] = fc;
        fs = -fs / ((2.0 * k + 2.0) * (2.0 * k + 3.0));
        fc = -fc / ((2.0 * k + 1.0) * (2.0 * k + 2.0));
    }
    double ps = sn_coef[DT_TRIG_TERMS - 1], pc = cs_coef[DT_TRIG_TERMS - 1];
    for (int k = DT_TRIG_TERMS - 2; k >= 0; --k) { ps = ps * z + sn_coef[k]; pc = pc * z + cs_coef[k]; }
    double s = a * ps, c = pc;
    switch (((int)q) & 3) {
        case 0: *sn = s; *cs = c; break;
        case 1: *sn = c; *cs = -s; break;
        case 2: *sn = -s; *cs = -c; break;
        default: *sn = -c; *cs = s; break;
    }
}

/* Element `lane` (0..4) of the block `w` as a uniform. */
DEV double dt_uniform(const unsigned int w[4], int lane) { return dt_unit(w[lane]); }

/* Element `lane` of the block `w` as a standard normal: Box-Muller on the word pair of the lane. */
DEV double dt_normal(const unsigned int w[4], int lane) {
    int pair = lane & ~1;
    double u1 = dt_unit(w[pair]);
    double u2 = dt_unit(w[pair + 1]);
    double r = sqrt(-2.0 * dt_log(u1));
    double sn, cs;
    dt_sincos_turn(u2, &sn, &cs);
    return (lane & 1) ? r * sn : r * cs;
}

/* Global element `i` of the random stream of key (k0, k1) starting at counter block `offset`. */
DEV double dt_random(unsigned long long i, unsigned int k0, unsigned int k1, unsigned long long offset, int normal) {
    unsigned long long b = offset + i / 4;
    unsigned int w[4] = { (unsigned int)b, (unsigned int)(b >> 32), 0u, 0u };
    dt_philox(w, k0, k1);
    return normal ? dt_normal(w, (int)(i % 4)) : dt_uniform(w, (int)(i % 4));
}
"#;

/// Definitions every module starts with (not per dtype).
const PRELUDE: &str = r#"
#define DEV __device__ static
#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define K(name) CAT(name, SFX)
#define GRID_LOOP(i, n) for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (unsigned long long)blockDim.x * gridDim.x)
typedef unsigned long long u64;
typedef long long i64;

/* Output shape and the element strides of up to two operands (0 where broadcast). */
struct Strided { int nd; i64 shape[MAX_DIMS]; i64 s0[MAX_DIMS]; i64 s1[MAX_DIMS]; };

DEV void dt_offsets(const Strided& g, u64 i, i64* o0, i64* o1) {
    i64 a = 0, b = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
        i64 k = (i64)(i % (u64)g.shape[d]);
        i /= (u64)g.shape[d];
        a += k * g.s0[d];
        b += k * g.s1[d];
    }
    *o0 = a; *o1 = b;
}

DEV double dt_inf() { return __longlong_as_double(0x7ff0000000000000ULL); }
DEV double dt_nan() { return __longlong_as_double(0x7ff8000000000000ULL); }

/* `s` and `t` are the op's scalars in the element type (see `args::unary_scalars`). */
template <typename T> DEV T dt_unary(int op, T x, T s, T t) {
    switch (op) {
/*DT_UNARY_CASES*/
        default: return (T)dt_nan();
    }
}

template <typename T> DEV T dt_binary(int op, T x, T y) {
    switch (op) {
        case 0: return x + y;
        case 1: return x - y;
        case 2: return x * y;
        case 3: return x / y;
        case 4: return x == y ? (T)1 : (T)0;
        case 5: return x != y ? (T)1 : (T)0;
        case 6: return x < y ? (T)1 : (T)0;
        case 7: return x <= y ? (T)1 : (T)0;
        case 8: return x > y ? (T)1 : (T)0;
        case 9: return x >= y ? (T)1 : (T)0;
        case 10: return x != x || x > y ? x : y; /* NaN if either is NaN */
        case 11: return x != x || x < y ? x : y;
        default: return (T)dt_nan();
    }
}

/* Reductions: 0 sum (and mean), 1 max, 2 min; max and min propagate NaN. */
template <typename T> DEV T dt_reduce_init(int op) {
    return op == 1 ? (T)(-dt_inf()) : op == 2 ? (T)dt_inf() : (T)0;
}
template <typename T> DEV T dt_combine(int op, T a, T b) {
    if (op == 0) return a + b;
    if (a != a) return a;
    if (b != b) return b;
    if (op == 1) return b > a ? b : a;
    return b < a ? b : a;
}

/* Combines v over the block (blockDim.x a power of two); every thread gets the result. */
template <typename T> DEV T dt_block_reduce(T* sh, T v, int op) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) sh[threadIdx.x] = dt_combine(op, sh[threadIdx.x], sh[threadIdx.x + w]);
        __syncthreads();
    }
    T r = sh[0];
    __syncthreads();
    return r;
}

/* Kept dims (output order) and reduced dims of a reduction, with their input strides. */
struct Reduce { int nk; i64 kshape[MAX_DIMS]; i64 kstride[MAX_DIMS]; int nr; i64 rshape[MAX_DIMS]; i64 rstride[MAX_DIMS]; };

DEV i64 dt_offset_of(u64 i, int nd, const i64* shape, const i64* stride) {
    i64 o = 0;
    for (int d = nd - 1; d >= 0; --d) { o += (i64)(i % (u64)shape[d]) * stride[d]; i /= (u64)shape[d]; }
    return o;
}

/* An id in [0, n), or -1. Ids are i64 in every kernel: never a float, which would round them. */
DEV i64 dt_id(i64 v, u64 n) { return v >= 0 && (u64)v < n ? v : -1; }

/* Gather and its gradient: the iterated shape, and the row-major strides and shape of the other
   operand (the gathered input, or the gradient a scatter reads). */
struct Gather { int nd; int dim; i64 shape[MAX_DIMS]; i64 stride[MAX_DIMS]; i64 bound[MAX_DIMS]; };

/* The 16-bit floats as their bits (unsigned short) and f32, both ways; rounding to nearest even,
   NaN stays NaN (quiet), as the `half` crate converts on the host. */
DEV float dt_bf16_to_f32(unsigned short h) { return __uint_as_float((unsigned int)h << 16); }
DEV unsigned short dt_f32_to_bf16(float f) {
    unsigned int x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    unsigned int r = x >> 16;
    if ((x & 0x8000u) && (x & 0x17fffu)) r += 1; /* above half, or exactly half with r odd */
    return (unsigned short)r;
}
DEV float dt_f16_to_f32(unsigned short h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu) return __uint_as_float(sign | 0x7f800000u | (m << 13) | (m ? 0x400000u : 0u));
    if (e == 0) {
        if (m == 0) return __uint_as_float(sign);
        int k = 0; /* subnormal: normalise the mantissa */
        while (!(m & 0x400u)) { m <<= 1; ++k; }
        return __uint_as_float(sign | ((unsigned int)(113 - k) << 23) | ((m & 0x3ffu) << 13));
    }
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}
DEV unsigned short dt_f32_to_f16(float f) {
    unsigned int x = __float_as_uint(f), sign = (x >> 16) & 0x8000u, m = x & 0x7fffffu;
    int e = (int)((x >> 23) & 0xffu);
    if (e == 0xff) return (unsigned short)(sign | 0x7c00u | (m ? 0x200u | (m >> 13) : 0u));
    int he = e - 127 + 15;
    if (he >= 0x1f) return (unsigned short)(sign | 0x7c00u);
    if (he <= 0) {
        if (14 - he > 24) return (unsigned short)sign;
        m |= 0x800000u;
        unsigned int hm = m >> (14 - he), round = 1u << (13 - he);
        if ((m & round) && (m & (3u * round - 1u))) hm += 1;
        return (unsigned short)(sign | hm);
    }
    unsigned int r = sign | ((unsigned int)he << 10) | (m >> 13);
    if ((x & 0x1000u) && (x & 0x2fffu)) r += 1;
    return (unsigned short)r;
}

/* Rust's `as` from a double to an integer: truncation toward zero, saturating at the type's
   bounds, NaN to 0 (explicit, since C leaves out-of-range conversions undefined). */
DEV long long dt_f64_to_i64(double v) {
    return v != v ? 0 : v >= 9223372036854775808.0 ? 0x7fffffffffffffffLL : v <= -9223372036854775808.0 ? (-0x7fffffffffffffffLL - 1) : (long long)v;
}
DEV int dt_f64_to_i32(double v) {
    return v != v ? 0 : v >= 2147483647.0 ? 2147483647 : v <= -2147483648.0 ? (-2147483647 - 1) : (int)v;
}
DEV unsigned char dt_f64_to_u8(double v) { return v != v ? 0 : v >= 255.0 ? 255 : v <= 0.0 ? 0 : (unsigned char)v; }

/* Pack plan table: one row of PACK_ROW u64 per block: src offset, dst offset, dims, first
   element, extents[MAX_DIMS], src strides[MAX_DIMS], dst strides[MAX_DIMS]. */
#define PACK_ROW (4 + 3 * MAX_DIMS)
"#;

/// The arithmetic kernels of a float ([`FLOAT_KERNELS`]; `SFX`, the storage type `S`, the
/// compute type `T` and the conversions `LD` / `ST` defined in front): elements are widened
/// with `LD` on load, computed in `T`, and rounded once with `ST` on store.
const TYPED: &str = r#"

extern "C" __global__ void K(unary)(const S* a, S* o, u64 n, int op, T s, T t) {
    GRID_LOOP(i, n) o[i] = ST(dt_unary<T>(op, LD(a[i]), s, t));
}

extern "C" __global__ void K(binary)(const S* a, const S* b, S* o, u64 n, int op, Strided g) {
    GRID_LOOP(i, n) {
        i64 ia, ib;
        dt_offsets(g, i, &ia, &ib);
        o[i] = ST(dt_binary<T>(op, LD(a[ia]), LD(b[ib])));
    }
}

/* One block per output element; `scale` multiplies the result when op is a mean. */
extern "C" __global__ void K(reduce)(const S* a, S* o, u64 nout, u64 nred, int op, int mean, T scale, Reduce g) {
    __shared__ T sh[BLOCK];
    for (u64 out = blockIdx.x; out < nout; out += gridDim.x) {
        i64 base = dt_offset_of(out, g.nk, g.kshape, g.kstride);
        T acc = dt_reduce_init<T>(op);
        for (u64 j = threadIdx.x; j < nred; j += blockDim.x) acc = dt_combine(op, acc, LD(a[base + dt_offset_of(j, g.nr, g.rshape, g.rstride)]));
        T r = dt_block_reduce(sh, acc, op);
        if (threadIdx.x == 0) o[out] = ST(mean ? r * scale : r);
    }
}

/* Rows of `len` elements `inner` apart: lane l starts at (l / inner) len inner + l % inner.
   The maximum ignores NaN (as the host kernel does); the sum then carries it. */
extern "C" __global__ void K(softmax)(const S* x, S* o, u64 lanes, u64 len, u64 inner, int log_out) {
    __shared__ T sh[BLOCK];
    for (u64 l = blockIdx.x; l < lanes; l += gridDim.x) {
        u64 base = (l / inner) * len * inner + l % inner;
        T m = (T)(-dt_inf());
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) { T v = LD(x[base + j * inner]); m = v > m ? v : m; }
        sh[threadIdx.x] = m;
        __syncthreads();
        for (unsigned w = blockDim.x / 2; w > 0; w >>= 1) {
            if (threadIdx.x < w) { T v = sh[threadIdx.x + w]; if (v > sh[threadIdx.x]) sh[threadIdx.x] = v; }
            __syncthreads();
        }
        m = sh[0];
        __syncthreads();
        T s = (T)0;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) s += exp(LD(x[base + j * inner]) - m);
        s = dt_block_reduce(sh, s, 0);
        T ls = log(s);
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            T v = LD(x[base + j * inner]);
            o[base + j * inner] = ST(log_out ? v - m - ls : exp(v - m) / s);
        }
    }
}

/* Softmax: g_in = y (g - sum g y); log-softmax: g_in = g - e^y sum g. */
extern "C" __global__ void K(softmax_bwd)(const S* y, const S* g, S* o, u64 lanes, u64 len, u64 inner, int log_out) {
    __shared__ T sh[BLOCK];
    for (u64 l = blockIdx.x; l < lanes; l += gridDim.x) {
        u64 base = (l / inner) * len * inner + l % inner;
        T s = (T)0;
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            u64 k = base + j * inner;
            s += log_out ? LD(g[k]) : LD(g[k]) * LD(y[k]);
        }
        s = dt_block_reduce(sh, s, 0);
        for (u64 j = threadIdx.x; j < len; j += blockDim.x) {
            u64 k = base + j * inner;
            o[k] = ST(log_out ? LD(g[k]) - exp(LD(y[k])) * s : LD(y[k]) * (LD(g[k]) - s));
        }
    }
}

/* Rows ids - row0 of a [rows, cols] table shard, zeros for other ids; *bad = 1 on an invalid id. */
extern "C" __global__ void K(embedding)(const S* table, const i64* ids, S* o, u64 nids, u64 cols, u64 rows, u64 row0, u64 vocab, int* bad) {
    GRID_LOOP(i, nids * cols) {
        u64 k = i / cols, c = i % cols;
        i64 v = dt_id(ids[k], vocab);
        if (v < 0) { atomicExch(bad, 1); o[i] = ST((T)0); continue; }
        o[i] = ((u64)v >= row0 && (u64)v < row0 + rows) ? table[((u64)v - row0) * cols + c] : ST((T)0);
    }
}

/* Ones at ids in a zeroed [nids, classes] output. */
extern "C" __global__ void K(one_hot)(const i64* ids, S* o, u64 nids, u64 classes, int* bad) {
    GRID_LOOP(k, nids) {
        i64 v = dt_id(ids[k], classes);
        if (v < 0) { atomicExch(bad, 1); continue; }
        o[k * classes + (u64)v] = ST((T)1);
    }
}

/* A shard of a random tensor: local element i sits at global flat index base + sum_d i_d g.s0[d]. */
extern "C" __global__ void K(random)(S* o, u64 n, Strided g, u64 base, unsigned int k0, unsigned int k1, u64 offset, int normal) {
    GRID_LOOP(i, n) {
        i64 rel, unused;
        dt_offsets(g, i, &rel, &unused);
        o[i] = ST((T)dt_random(base + (u64)rel, k0, k1, offset, normal));
    }
}

/* a where cond is non-zero (NaN counts), else b; g holds the strides of cond and a, h those of b. */
extern "C" __global__ void K(where)(const S* c, const S* a, const S* b, S* o, u64 n, Strided g, Strided h) {
    GRID_LOOP(i, n) {
        i64 ic, ia, ib, unused;
        dt_offsets(g, i, &ic, &ia);
        dt_offsets(h, i, &ib, &unused);
        o[i] = LD(c[ic]) != (T)0 ? a[ia] : b[ib];
    }
}

/* tril (lower) or triu relative to `diagonal` of the last two dims [rows, cols] of a shard whose
   last two dims start at global (row0, col0): a causal mask's local block. */
extern "C" __global__ void K(tri)(const S* a, S* o, u64 n, u64 rows, u64 cols, int lower, i64 diagonal, i64 row0, i64 col0) {
    GRID_LOOP(i, n) {
        i64 j = (i64)(i % cols) + col0, r = (i64)((i / cols) % rows) + row0;
        int keep = lower ? j - r <= diagonal : j - r >= diagonal;
        o[i] = keep ? a[i] : ST((T)0);
    }
}

/* First index of the maximum (max) or minimum of each lane (softmax's lane layout), one thread
   per lane, as i64 (PyTorch); a NaN counts as the extreme, so the scan stops at the first one. */
extern "C" __global__ void K(arg_reduce)(const S* a, i64* o, u64 lanes, u64 len, u64 inner, int max) {
    GRID_LOOP(l, lanes) {
        u64 base = (l / inner) * len * inner + l % inner, at = 0;
        T best = LD(a[base]);
        for (u64 k = 1; k < len && best == best; ++k) {
            T v = LD(a[base + k * inner]);
            if (v != v || (max ? v > best : v < best)) { best = v; at = k; }
        }
        o[l] = (i64)at;
    }
}

/* Gradient of index_select, [outer, len, inner] from g [outer, nids, inner]. Each output sums
   its ids' slices in id order (no atomics): deterministic and bit-identical to the host. */
extern "C" __global__ void K(index_add)(const S* g, const i64* ids, S* o, u64 n, u64 len, u64 nids, u64 inner) {
    GRID_LOOP(i, n) {
        u64 c = i % inner, j = (i / inner) % len, outer = i / (inner * len);
        T acc = (T)0;
        for (u64 k = 0; k < nids; ++k)
            if (dt_id(ids[k], len) == (i64)j) acc += LD(g[(outer * nids + k) * inner + c]);
        o[i] = ST(acc);
    }
}

/* Gradient of gather: g iterates the output's shape over the gradient's strides and shape; each
   output sums the gradient entries of its lane whose id names it, in lane order (no atomics):
   deterministic and bit-identical to the host. */
extern "C" __global__ void K(scatter_add)(const S* gr, const i64* ids, S* o, u64 n, u64 len, Gather g) {
    GRID_LOOP(i, n) {
        i64 base = 0, at = 0;
        u64 r = i;
        int inside = 1;
        for (int d = g.nd - 1; d >= 0; --d) {
            i64 k = (i64)(r % (u64)g.shape[d]);
            r /= (u64)g.shape[d];
            if (d == g.dim) at = k;
            else { inside = inside && k < g.bound[d]; base += k * g.stride[d]; }
        }
        T acc = (T)0;
        for (i64 k = 0; inside && k < g.bound[g.dim]; ++k) {
            i64 p = base + k * g.stride[g.dim];
            if (dt_id(ids[p], len) == at) acc += LD(gr[p]);
        }
        o[i] = ST(acc);
    }
}

/* The optimizer updates, operation for operation as the host kernels (see --fmad=false). */
extern "C" __global__ void K(sgd)(S* w, const S* g, u64 n, T lr, T wd) {
    GRID_LOOP(i, n) {
        T wi = LD(w[i]), gi = LD(g[i]);
        T d = wd != (T)0 ? gi + wd * wi : gi;
        w[i] = ST(wi - lr * d);
    }
}

extern "C" __global__ void K(sgd_momentum)(S* w, const S* g, S* b, u64 n, T lr, T m, T wd, int first) {
    GRID_LOOP(i, n) {
        T wi = LD(w[i]), gi = LD(g[i]);
        T d = wd != (T)0 ? gi + wd * wi : gi;
        T bi = first ? d : m * LD(b[i]) + d;
        b[i] = ST(bi);
        w[i] = ST(wi - lr * bi);
    }
}

extern "C" __global__ void K(adamw)(S* w, const S* g, S* m, S* v, u64 n, T lr, T b1, T b2, T eps, T wd, T c1, T c2) {
    GRID_LOOP(i, n) {
        T wi = LD(w[i]), gi = LD(g[i]);
        wi -= lr * wd * wi;
        T mi = b1 * LD(m[i]) + ((T)1 - b1) * gi;
        T vi = b2 * LD(v[i]) + ((T)1 - b2) * gi * gi;
        wi -= lr * (mi / c1) / (sqrt(vi / c2) + eps);
        m[i] = ST(mi); v[i] = ST(vi); w[i] = ST(wi);
    }
}
"#;

/// The kernels of [`ATOMIC_KERNELS`] (`T` and `SFX` defined in front, f32 and f64 only).
const ATOMIC: &str = r#"
/* Scatter-add of the gradient rows into a zeroed [rows, cols] shard. */
extern "C" __global__ void K(embedding_bwd)(const T* g, const i64* ids, T* o, u64 nids, u64 cols, u64 rows, u64 row0, u64 vocab, int* bad) {
    GRID_LOOP(i, nids * cols) {
        u64 k = i / cols, c = i % cols;
        i64 v = dt_id(ids[k], vocab);
        if (v < 0) { atomicExch(bad, 1); continue; }
        if ((u64)v >= row0 && (u64)v < row0 + rows) atomicAdd(&o[((u64)v - row0) * cols + c], g[i]);
    }
}
"#;

/// The kernels of [`COPY_KERNELS`] (`T` and `SFX` defined in front): they only move elements.
const COPY: &str = r#"
extern "C" __global__ void K(fill)(T* o, u64 n, T v) { GRID_LOOP(i, n) o[i] = v; }

/* Every element of every block of a pack plan, one thread each (blocks found by binary search
   on their first element). */
extern "C" __global__ void K(pack)(const T* src, T* dst, const u64* table, u64 nblocks, u64 total) {
    GRID_LOOP(i, total) {
        u64 lo = 0, hi = nblocks - 1;
        while (lo < hi) {
            u64 mid = (lo + hi + 1) / 2;
            if (table[mid * PACK_ROW + 3] <= i) lo = mid; else hi = mid - 1;
        }
        const u64* b = table + lo * PACK_ROW;
        u64 r = i - b[3], so = b[0], d = b[1];
        for (int k = (int)b[2] - 1; k >= 0; --k) {
            u64 e = b[4 + k], ik = r % e;
            r /= e;
            so += ik * b[4 + MAX_DIMS + k];
            d += ik * b[4 + 2 * MAX_DIMS + k];
        }
        dst[d] = src[so];
    }
}

/* One part of a concatenation: its rows of `width` elements land `stride` apart from `offset`. */
extern "C" __global__ void K(cat)(const T* src, T* o, u64 n, u64 width, u64 stride, u64 offset) {
    GRID_LOOP(i, n) o[(i / width) * stride + offset + i % width] = src[i];
}

/* [outer, nids, inner] from [outer, len, inner] at ids (checked before; zeros if bad). */
extern "C" __global__ void K(index_select)(const T* a, const i64* ids, T* o, u64 n, u64 len, u64 nids, u64 inner) {
    GRID_LOOP(i, n) {
        u64 c = i % inner, k = (i / inner) % nids, outer = i / (inner * nids);
        i64 v = dt_id(ids[k], len);
        o[i] = v < 0 ? (T)0 : a[(outer * len + (u64)v) * inner + c];
    }
}

/* out[ix] = a[ix with ix[dim] = ids[ix]]: g iterates the ids' shape over a's strides. */
extern "C" __global__ void K(gather)(const T* a, const i64* ids, T* o, u64 n, u64 len, Gather g) {
    GRID_LOOP(i, n) {
        i64 src = 0;
        u64 r = i;
        for (int d = g.nd - 1; d >= 0; --d) {
            i64 k = (i64)(r % (u64)g.shape[d]);
            r /= (u64)g.shape[d];
            if (d != g.dim) src += k * g.stride[d];
        }
        i64 v = dt_id(ids[i], len);
        o[i] = v < 0 ? (T)0 : a[src + v * g.stride[g.dim]];
    }
}
"#;

/// The kernels of [`ID_KERNELS`] (`SFX` defined in front as [`ID_DTYPE`]).
const IDS: &str = r#"
/* *bad = 1 when an id is not in [0, bound). */
extern "C" __global__ void K(check_ids)(const i64* ids, u64 n, u64 bound, int* bad) {
    GRID_LOOP(i, n) if (dt_id(ids[i], bound) < 0) atomicExch(bad, 1);
}
"#;

/// The `#define`s [`RNG_SOURCE`] needs: term counts and constants, printed from the Rust
/// values `crate::rng` uses (shortest round-trip form, so C reads the same doubles).
pub fn rng_defines() -> String {
    use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI, FRAC_PI_2};
    format!(
        "#define DT_LOG_TERMS {LOG_TERMS}\n#define DT_TRIG_TERMS {TRIG_TERMS}\n#define DT_SQRT_HALF {FRAC_1_SQRT_2:?}\n\
         #define DT_HALF_PI {FRAC_PI_2:?}\n#define DT_LN2_HI {LN2_HI:?}\n#define DT_LN2_LO {LN2_LO:?}\n\
         #define DT_2_SQRT_PI {FRAC_2_SQRT_PI:?}\n"
    )
}

/// The cases of `dt_unary`'s `switch`, one per entry of the unary vocabulary
/// ([`UNARY_CUDA_CASES`]).
fn unary_cases() -> String {
    UNARY_CUDA_CASES.iter().map(|(code, stmt)| format!("        case {code}: {stmt}\n")).collect()
}

/// The whole CUDA C module: constants, prelude, random numbers, the kernels of every dtype,
/// the id kernels and the casts between dtypes.
pub fn module_source() -> String {
    let mut s = format!(
        "#define MAX_DIMS {MAX_DIMS}\n#define BLOCK {BLOCK}\n#define GELU_C {GELU_C:?}\n#define GELU_A {GELU_A:?}\n{}",
        rng_defines()
    );
    s.push_str(&PRELUDE.replace("/*DT_UNARY_CASES*/\n", &unary_cases()));
    s.push_str(RNG_SOURCE);
    for (sfx, ty, ..) in CASTS {
        s.push_str(&format!("\n#define T {ty}\n#define SFX {sfx}\n{COPY}\n#undef T\n#undef SFX\n"));
    }
    for (sfx, store, compute, ld, st) in FLOATS {
        s.push_str(&format!(
            "\n#define SFX {sfx}\n#define S {store}\n#define T {compute}\n#define LD(x) {ld}\n#define ST(x) {st}\n{TYPED}\n"
        ));
        if ATOMIC_DTYPES.contains(&sfx) {
            s.push_str(ATOMIC);
        }
        s.push_str("#undef SFX\n#undef S\n#undef T\n#undef LD\n#undef ST\n");
    }
    s.push_str(&format!("\n#define SFX {ID_DTYPE}\n{IDS}\n#undef SFX\n"));
    for (fsfx, from, fint, widen, ..) in CASTS {
        for (tsfx, to, _, _, of_f64, of_i64) in CASTS {
            let round = if fint { of_i64 } else { of_f64 };
            let value = if fsfx == tsfx { "a[i]".to_string() } else { round.replace('X', &widen.replace('X', "a[i]")) };
            s.push_str(&format!(
                "extern \"C\" __global__ void cast_{fsfx}_{tsfx}(const {from}* a, {to}* o, u64 n) {{ GRID_LOOP(i, n) o[i] = {value}; }}\n"
            ));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_is_defined_once_per_dtype() {
        let src = module_source();
        let defined = |block: &str, k: &str| block.contains(&format!("void K({k})("));
        for k in COPY_KERNELS.iter().chain(&FLOAT_KERNELS).chain(&ATOMIC_KERNELS).chain(&ID_KERNELS) {
            let homes = [COPY, TYPED, ATOMIC, IDS].iter().filter(|b| defined(b, k)).count();
            assert_eq!(homes, 1, "{k} is not defined exactly once");
        }
        let names = kernel_names();
        let casts = CASTS.len() * CASTS.len();
        let per_dtype = CASTS.len() * COPY_KERNELS.len()
            + FLOATS.len() * FLOAT_KERNELS.len()
            + ATOMIC_DTYPES.len() * ATOMIC_KERNELS.len()
            + ID_KERNELS.len();
        assert_eq!(names.len(), per_dtype + casts);
        for n in &names {
            let (name, sfx) = match n.strip_prefix("cast_") {
                Some(pair) => pair.split_once('_').map(|(f, t)| (format!("cast_{f}"), t)).unwrap(),
                None => n.rsplit_once('_').map(|(k, s)| (k.to_string(), s)).unwrap(),
            };
            assert!(has_kernel(&name, sfx), "{n}");
        }
        assert!(!has_kernel("embedding_bwd", "bf16") && !has_kernel("unary", "i64") && !has_kernel("cast_u8", "x"));
        assert!(has_kernel("check_ids", "i64") && !has_kernel("check_ids", "f32") && has_kernel("gather", "u8"));
        // No kernel reads an id (or writes an index) as a float: every id parameter is i64.
        for block in [TYPED, ATOMIC, COPY, IDS] {
            assert!(!block.contains("S* ids") && !block.contains("T* ids"), "an id read as an element");
        }
        assert!(src.contains("cast_f64_f32") && src.contains("cast_i64_u8"));
    }

    /// The C text of the CUDA kernels' random numbers, compiled by the host C compiler, gives
    /// the host generator's values bit for bit (the device computes the same IEEE operations;
    /// the GPU test checks the device itself).
    #[test]
    fn cuda_rng_source_matches_the_host_generator_bit_for_bit() {
        use crate::rng::{Stream, DEFAULT_SEED};
        use rand_philox::splitmix64;
        use std::process::Command;
        let harness = r#"
int main(int argc, char** argv) {
    unsigned int k0 = (unsigned int)strtoul(argv[1], 0, 10), k1 = (unsigned int)strtoul(argv[2], 0, 10);
    unsigned long long offset = strtoull(argv[3], 0, 10), n = strtoull(argv[4], 0, 10);
    for (unsigned long long i = 0; i < n; ++i)
        for (int normal = 0; normal < 2; ++normal) {
            double v = dt_random(i, k0, k1, offset, normal);
            unsigned long long bits;
            memcpy(&bits, &v, 8);
            printf("%llx\n", bits);
        }
    return 0;
}
"#;
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("rng.c");
        let exe = dir.path().join("rng");
        let head =
            "#include <math.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#define DEV static\n";
        std::fs::write(&c, format!("{head}{}{RNG_SOURCE}{harness}", rng_defines())).unwrap();
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let built = Command::new(&cc)
            .args(["-O2", "-std=c99", "-ffp-contract=off", "-o"])
            .arg(&exe)
            .arg(&c)
            .arg("-lm")
            .output();
        match built {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!("{cc} rejected the kernels' RNG source: {}", String::from_utf8_lossy(&o.stderr)),
            Err(e) => {
                eprintln!("skipping: no host C compiler `{cc}` ({e})");
                return;
            }
        }
        let n = 2048usize;
        for (seed, offset) in [(0u64, 0u64), (DEFAULT_SEED, 17), (42, (1 << 32) - 100), (u64::MAX, 1 << 40)] {
            let key = splitmix64(seed);
            let out = Command::new(&exe)
                .args([(key as u32).to_string(), ((key >> 32) as u32).to_string(), offset.to_string(), n.to_string()])
                .output()
                .unwrap();
            let text = String::from_utf8(out.stdout).unwrap();
            let got: Vec<u64> = text.lines().map(|l| u64::from_str_radix(l, 16).unwrap()).collect();
            assert_eq!(got.len(), 2 * n);
            let mut s = Stream::new(seed, offset);
            for i in 0..n {
                assert_eq!(
                    got[2 * i],
                    s.uniform::<f64>(i).to_bits(),
                    "uniform, seed {seed}, offset {offset}, element {i}"
                );
                assert_eq!(
                    got[2 * i + 1],
                    s.normal::<f64>(i).to_bits(),
                    "normal, seed {seed}, offset {offset}, element {i}"
                );
            }
        }
    }
}
