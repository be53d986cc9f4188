//! Helpers of the Hugging Face checkpoint tests: safetensors files written from Rust, in any
//! float dtype, or byte by byte for hostile headers.
#![allow(dead_code)]

use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::Error;
use safetensors::Dtype;
use std::borrow::Cow;
use std::path::Path;

/// A tensor to write: dtype, shape and little-endian bytes.
pub struct Raw {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl safetensors::View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

/// `v` stored as `dtype` (rounded to nearest when narrower).
pub fn encode(dtype: Dtype, v: &ArrayD<f64>) -> Raw {
    let data = v
        .iter()
        .flat_map(|&x| match dtype {
            Dtype::BF16 => half::bf16::from_f64(x).to_le_bytes().to_vec(),
            Dtype::F16 => half::f16::from_f64(x).to_le_bytes().to_vec(),
            Dtype::F32 => (x as f32).to_le_bytes().to_vec(),
            Dtype::F64 => x.to_le_bytes().to_vec(),
            Dtype::I64 => (x as i64).to_le_bytes().to_vec(),
            Dtype::I16 => (x as i16).to_le_bytes().to_vec(),
            d => panic!("no encoder for {d:?}"),
        })
        .collect();
    Raw { dtype, shape: v.shape().to_vec(), data }
}

/// Writes a safetensors file with the safetensors crate (`format: pt`, as `transformers`).
pub fn write_st(path: &Path, tensors: &[(&str, Dtype, &ArrayD<f64>)]) {
    let raws: Vec<(String, Raw)> = tensors.iter().map(|(n, d, v)| (n.to_string(), encode(*d, v))).collect();
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(raws.iter().map(|(n, r)| (n.as_str(), r)), Some(meta), path).unwrap();
}

/// Writes `model.safetensors.index.json` mapping each tensor to a file.
pub fn write_index(dir: &Path, map: &[(&str, &str)]) {
    let weight_map: serde_json::Map<String, serde_json::Value> =
        map.iter().map(|(t, f)| (t.to_string(), serde_json::Value::from(*f))).collect();
    let index = serde_json::json!({ "metadata": { "total_size": 0 }, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
}

/// A file made of a header length `n`, then `rest` (header and data), byte for byte.
pub fn write_raw(path: &Path, n: u64, rest: &[u8]) {
    let mut bytes = n.to_le_bytes().to_vec();
    bytes.extend_from_slice(rest);
    std::fs::write(path, bytes).unwrap();
}

/// A file whose header is `header` (its true length) followed by `data`.
pub fn write_header(path: &Path, header: &str, data: &[u8]) {
    let mut rest = header.as_bytes().to_vec();
    rest.extend_from_slice(data);
    write_raw(path, header.len() as u64, &rest);
}

/// The values `v` takes after a round trip through `dtype` and then into `f32`/`f64` (`T`).
pub fn through(dtype: Dtype, v: &ArrayD<f64>) -> ArrayD<f64> {
    v.mapv(|x| match dtype {
        Dtype::BF16 => half::bf16::from_f64(x).to_f64(),
        Dtype::F16 => half::f16::from_f64(x).to_f64(),
        Dtype::F32 => x as f32 as f64,
        _ => x,
    })
}

/// Checks a `Checkpoint` error naming `file` whose reason holds every one of `needles`.
pub fn expect_checkpoint<T: std::fmt::Debug>(r: dtensor_runtime::Result<T>, file: &str, needles: &[&str]) {
    match r {
        Err(Error::Checkpoint { path, reason }) => {
            assert!(path.ends_with(file), "error names `{path}`, expected `{file}` ({reason})");
            for n in needles {
                assert!(reason.contains(n), "reason `{reason}` does not mention `{n}`");
            }
        }
        other => panic!("expected a checkpoint error naming {file}, got {other:?}"),
    }
}
