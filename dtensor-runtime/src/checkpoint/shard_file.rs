//! Reading and writing safetensors files (this crate's shard files and Hugging Face weight
//! files alike): the header is parsed on its own and checked against the file's length, and
//! tensor data is read by byte range (seek + read), so loading a shard never reads the parts
//! of a file it does not need. Positioned reads rather than a memory map: a file truncated
//! by another process while mapped would kill the reader with `SIGBUS`; a read just fails.

use super::convert::{decode_into, loadable_size};
use super::index::safetensors_dtype;
use super::safe_file::SafeDir;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::shape::contiguous_strides;
use ndarray::ArrayD;
use safetensors::tensor::Metadata;
use safetensors::Dtype;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Same bound as the safetensors crate: a larger header is treated as corrupt.
const MAX_HEADER: u64 = 100_000_000;

/// Largest scratch buffer of a converting read (bf16 to f32, ...): runs are converted in
/// pieces of this size, so converting costs no memory in proportion to the tensor.
const CONVERT_CHUNK_BYTES: usize = 1 << 20;

fn err(path: &Path, reason: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.display().to_string(), reason: reason.into() }
}

/// An open safetensors file whose header has been parsed and checked against its length: the
/// safetensors crate checks, when parsing, that the tensors' byte ranges follow each other
/// without gap or overlap (sorted by offset: `O(n log n)`) and that each range has the size
/// its dtype and shape give (checked multiplication); [`ShardFile::open`] checks that they end
/// where the file does.
pub(crate) struct ShardFile {
    path: PathBuf,
    file: File,
    /// Byte offset of the data section.
    data_start: u64,
    meta: Metadata,
    /// Current file position (to skip seeks between adjacent runs).
    pos: u64,
    /// Tensor payload bytes read so far.
    pub(crate) payload_read: u64,
    /// Header bytes read (length prefix and JSON header).
    pub(crate) header_read: u64,
    /// Reused buffer of converting reads.
    scratch: Vec<u8>,
}

impl ShardFile {
    /// Opens the file `name` of `dir` (see [`SafeDir::open`]) and reads only its header,
    /// checking every size it claims against the file's length.
    pub(crate) fn open(dir: &SafeDir, name: &str) -> Result<ShardFile> {
        let opened = dir.open(name)?;
        let (mut file, len, path) = (opened.file, opened.len, opened.path);
        let mut n = [0u8; 8];
        file.read_exact(&mut n)
            .map_err(|_| err(&path, format!("truncated: {len} bytes, less than the 8-byte header length")))?;
        let n = u64::from_le_bytes(n);
        if n > MAX_HEADER || len.checked_sub(8).is_none_or(|rest| n > rest) {
            return Err(err(&path, format!("bad header: header length {n} does not fit in a {len}-byte file")));
        }
        // At most MAX_HEADER, and backed by the file.
        let mut header = crate::alloc::try_zeroed::<u8>("reading a safetensors header", n as usize)?;
        file.read_exact(&mut header).map_err(|e| err(&path, format!("truncated header: {e}")))?;
        let meta: Metadata = serde_json::from_slice(&header)
            .map_err(|e| err(&path, format!("bad header: not a safetensors header: {e}")))?;
        let data_start = 8 + n; // n <= len - 8
        let want = u64::try_from(meta.data_len()).ok().and_then(|d| data_start.checked_add(d));
        if want != Some(len) {
            let what = if want.is_none_or(|w| w > len) { "truncated" } else { "corrupt" };
            let want = want.map_or_else(|| "more than 2^64".to_string(), |w| w.to_string());
            return Err(err(&path, format!("{what}: the header describes {want} bytes but the file has {len}")));
        }
        let header_read = data_start;
        Ok(ShardFile {
            path,
            file,
            data_start,
            meta,
            pos: data_start,
            payload_read: 0,
            header_read,
            scratch: Vec::new(),
        })
    }

    /// The file, as named in messages.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Names of the tensors in the file, in the order of their data.
    pub(crate) fn names(&self) -> Vec<String> {
        self.meta.offset_keys()
    }

    /// Dtype, shape and absolute data offset of tensor `name`.
    pub(crate) fn tensor(&self, name: &str) -> Result<(Dtype, &[usize], u64)> {
        // The header was checked against the file length (`open`) and the safetensors crate
        // checked each tensor's byte range against its shape, so the data exists in the file.
        let info =
            self.meta.info(name).ok_or_else(|| err(&self.path, format!("tensor `{name}` is missing from the file")))?;
        Ok((info.dtype, &info.shape, self.data_start + info.data_offsets.0 as u64))
    }

    /// Byte offset (absolute) of tensor `name`'s data, after checking its dtype and shape.
    pub(crate) fn locate<T: Scalar>(&self, name: &str, shape: &[usize]) -> Result<u64> {
        let (dtype, file_shape, at) = self.tensor(name)?;
        if dtype != safetensors_dtype(T::DTYPE) || file_shape != shape {
            return Err(err(
                &self.path,
                format!(
                    "tensor `{name}` is {dtype:?} {file_shape:?} in the file but the index says {} {shape:?}",
                    T::DTYPE.safetensors_name()
                ),
            ));
        }
        Ok(at)
    }

    /// Reads `bytes.len()` bytes starting at absolute byte `at`.
    fn read_bytes(&mut self, at: u64, bytes: &mut [u8]) -> Result<()> {
        if self.pos != at {
            self.file.seek(SeekFrom::Start(at)).map_err(|e| err(&self.path, format!("cannot seek: {e}")))?;
        }
        self.file
            .read_exact(bytes)
            .map_err(|e| err(&self.path, format!("cannot read {} bytes at {at}: {e}", bytes.len())))?;
        self.pos = at + bytes.len() as u64;
        self.payload_read += bytes.len() as u64;
        Ok(())
    }

    /// Reads `dst.len()` elements stored as `dtype` starting at absolute byte `at`, converting
    /// them when `dtype` is not `T`'s (`dtype` is loadable: see [`loadable_size`]).
    fn read_at<T: Scalar>(&mut self, at: u64, dtype: Dtype, dst: &mut [T]) -> Result<()> {
        if dtype == safetensors_dtype(T::DTYPE) {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
            self.read_bytes(at, bytes)?;
            from_le_in_place::<T>(bytes);
            return Ok(());
        }
        let size = loadable_size(dtype)
            .ok_or_else(|| err(&self.path, format!("{dtype:?} cannot be loaded as {}", T::DTYPE)))?;
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut at = at;
        for part in dst.chunks_mut((CONVERT_CHUNK_BYTES / size).max(1)) {
            scratch.resize(part.len() * size, 0);
            self.read_bytes(at, &mut scratch)?;
            decode_into(dtype, &scratch, part);
            at += scratch.len() as u64;
        }
        self.scratch = scratch;
        Ok(())
    }
}

/// A block of a saved tensor, where its data starts in a file and its dtype there.
pub(crate) struct SavedBlock<'a> {
    pub offset: &'a [usize],
    pub shape: &'a [usize],
    pub data_at: u64,
    pub dtype: Dtype,
}

/// Copies the part of `src` that falls inside the destination block (`dst_offset`,
/// `dst_shape`, row-major `dst`) from the file; returns the number of elements copied.
///
/// Plain arithmetic is safe here: `src` lies inside a tensor whose shape passed
/// [`checked_numel`](crate::shape::checked_numel) (checked by the index, or by the Hugging
/// Face loader for a whole-tensor block) and whose data was checked against the file's
/// length; `dst` is a buffer that exists.
///
/// Reads are runs that are contiguous in both the file and `dst`: the innermost dims the
/// intersection covers completely in both are merged into one read.
pub(crate) fn read_intersection<T: Scalar>(
    file: &mut ShardFile,
    src: &SavedBlock<'_>,
    dst_offset: &[usize],
    dst_shape: &[usize],
    dst: &mut [T],
) -> Result<usize> {
    let nd = dst_shape.len();
    let lo: Vec<usize> = (0..nd).map(|d| src.offset[d].max(dst_offset[d])).collect();
    let hi: Vec<usize> = (0..nd).map(|d| (src.offset[d] + src.shape[d]).min(dst_offset[d] + dst_shape[d])).collect();
    if (0..nd).any(|d| lo[d] >= hi[d]) {
        return Ok(0);
    }
    let ext: Vec<usize> = (0..nd).map(|d| hi[d] - lo[d]).collect();
    // Dims after `k` are whole in source and destination, so they merge into the run.
    let mut k = nd.saturating_sub(1);
    while k > 0 && ext[k] == src.shape[k] && ext[k] == dst_shape[k] {
        k -= 1;
    }
    let run: usize = ext[k.min(nd)..].iter().product();
    let (ss, ds) = (contiguous_strides(src.shape), contiguous_strides(dst_shape));
    let elem = (src.dtype.bitsize() / 8) as u64;
    let outer: usize = ext[..k].iter().product();
    let mut idx = vec![0usize; k];
    for _ in 0..outer {
        let (mut s, mut t) = (0usize, 0usize);
        for d in 0..nd {
            let i = if d < k { idx[d] } else { 0 };
            s += (lo[d] - src.offset[d] + i) * ss[d];
            t += (lo[d] - dst_offset[d] + i) * ds[d];
        }
        file.read_at(src.data_at + s as u64 * elem, src.dtype, &mut dst[t..t + run])?;
        // Next outer index, last dim fastest.
        for d in (0..k).rev() {
            idx[d] += 1;
            if idx[d] < ext[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(outer * run)
}

/// A tensor to write: safetensors' `View` over owned little-endian bytes.
pub(crate) struct RawTensor {
    pub dtype: safetensors::Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl RawTensor {
    pub(crate) fn of<T: Scalar>(a: &ArrayD<T>) -> RawTensor {
        let mut data: Vec<u8> = match a.as_slice() {
            Some(s) => bytemuck::cast_slice(s).to_vec(),
            None => a.iter().flat_map(|x| bytemuck::bytes_of(x).to_vec()).collect(),
        };
        from_le_in_place::<T>(&mut data); // the swap is its own inverse
        RawTensor { dtype: safetensors_dtype(T::DTYPE), shape: a.shape().to_vec(), data }
    }
}

impl safetensors::View for &RawTensor {
    fn dtype(&self) -> safetensors::Dtype {
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

/// `__metadata__` of a file of full tensors: `transformers` refuses safetensors weights
/// without `format: pt`.
pub(crate) fn pt_metadata() -> HashMap<String, String> {
    HashMap::from([("format".to_string(), "pt".to_string())])
}

/// Writes a safetensors file atomically. The safetensors crate follows the write rule of
/// [`safe_file`](super::safe_file) itself (a `tempfile` temporary file in the same directory,
/// renamed over `path`); a regression test plants a symbolic link at a shard's name to keep it so.
pub(crate) fn write_file(path: &Path, tensors: &[(String, RawTensor)], meta: HashMap<String, String>) -> Result<()> {
    safetensors::serialize_to_file(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(meta), path)
        .map_err(|e| err(path, format!("cannot write: {e}")))
}

/// safetensors data is little-endian; on a big-endian host swap every element.
fn from_le_in_place<T: Scalar>(bytes: &mut [u8]) {
    if cfg!(target_endian = "big") {
        for c in bytes.chunks_exact_mut(std::mem::size_of::<T>()) {
            c.reverse();
        }
    }
}
