//! Reading the JSON fixtures that `scripts/gen_*_fixture.py` write with transformers.
#![allow(dead_code)]

use dtensor::ndarray::Array2;
use serde_json::Value;
use std::path::Path;

/// The JSON file `dir/name`.
pub fn json(dir: &Path, name: &str) -> Value {
    let text = std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{}/{name}: {e}", dir.display()));
    serde_json::from_str(&text).expect("fixture JSON")
}

/// A list of equal-length lists of integers (token ids) as `[rows, cols]`.
pub fn ids(v: &Value) -> Array2<i64> {
    let rows: Vec<Vec<i64>> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect())
        .collect();
    Array2::from_shape_fn((rows.len(), rows[0].len()), |(i, j)| rows[i][j])
}

/// `{"shape": .., "data": [..]}`'s data as f32.
pub fn data(v: &Value) -> Vec<f32> {
    v["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}
