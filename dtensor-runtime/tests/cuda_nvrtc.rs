//! Compiles every device kernel with NVRTC to PTX and to machine code (no GPU needed, only
//! `libnvrtc`), and checks
//! that every kernel name the CUDA storage launches is an entry of the PTX.
//!
//! NVRTC is found by cudarc's library search (`LD_LIBRARY_PATH`), or loaded from the file
//! named by `DTENSOR_NVRTC_LIB` (e.g. the `libnvrtc.so.13` of the `nvidia-cuda-nvrtc` wheel).
//! The target is `DTENSOR_NVRTC_ARCH` (default `compute_90`, the H100/H200). Without NVRTC the
//! test prints why and passes.
#![cfg(feature = "cuda")]

use dtensor_runtime::cuda::{kernels, require, source, CudaLib};

/// Loads `DTENSOR_NVRTC_LIB` globally, so cudarc's load by soname finds it.
fn preload() -> Result<(), String> {
    let Ok(path) = std::env::var("DTENSOR_NVRTC_LIB") else { return Ok(()) };
    let c = std::ffi::CString::new(path.clone()).map_err(|e| e.to_string())?;
    // SAFETY: dlopen of a caller-named library; the handle is kept for the process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        return Err(format!("dlopen({path}) failed"));
    }
    Ok(())
}

#[test]
fn every_kernel_compiles_with_nvrtc() {
    let arch = std::env::var("DTENSOR_NVRTC_ARCH").unwrap_or_else(|_| "compute_90".into());
    if let Err(e) =
        preload().map_err(|e| e.to_string()).and_then(|()| require(CudaLib::Nvrtc).map_err(|e| e.to_string()))
    {
        println!("GPUCHECK nvrtc_compile_all | SKIP | {e}");
        eprintln!("skipping: NVRTC not loadable ({e}); set DTENSOR_NVRTC_LIB=/path/libnvrtc.so.13");
        return;
    }
    let ptx = kernels::compile_ptx(&arch).unwrap_or_else(|e| panic!("NVRTC rejected the kernels: {e}"));
    let text = ptx.to_src();
    let names = source::kernel_names();
    let missing: Vec<&String> = names.iter().filter(|n| !text.contains(&format!(".entry {n}("))).collect();
    assert!(missing.is_empty(), "kernels missing from the PTX: {missing:?}");
    let entries = text.matches(".entry ").count();
    assert_eq!(entries, names.len(), "the PTX has kernels no code launches");
    // Machine code for the same architecture, what a device loads first.
    let sm = arch.replace("compute_", "sm_");
    let cubin = kernels::compile_cubin(&sm).unwrap_or_else(|e| panic!("NVRTC could not emit {sm} code: {e}"));
    assert!(cubin.starts_with(b"\x7fELF"), "a CUBIN is an ELF image");
    println!(
        "GPUCHECK nvrtc_compile_all | PASS | {entries} kernels compiled to PTX for {arch} ({} bytes) and to {sm} machine code ({} bytes)",
        text.len(),
        cubin.len()
    );
}
