//! Run-time compilation: NVRTC to CUBIN for a real architecture, through an on-disk
//! cache keyed by source, architecture, NVRTC version and include paths.

use crate::CudaError;
use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;

/// Whether the NVRTC library can be loaded (never panics).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked); both pointers are valid.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    r.result()
        .map_err(|e| CudaError::NotAvailable(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

fn require_nvrtc() -> Result<(), CudaError> {
    if nvrtc_available() {
        Ok(())
    } else {
        Err(CudaError::NotAvailable(
            "libnvrtc not found (install the nvidia-cuda-nvrtc 13.0 wheel and put its lib \
             directory on LD_LIBRARY_PATH)"
                .into(),
        ))
    }
}

/// Extra include directories (`TESSERA_CUDA_INCLUDE`, colon-separated), e.g. the
/// nvidia-cuda-runtime wheel's `include/` for `cuda_bf16.h`.
fn include_paths() -> Vec<PathBuf> {
    std::env::var_os("TESSERA_CUDA_INCLUDE")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default()
}

/// Compiles `source` to a CUBIN for `arch` (a real architecture such as `sm_90`, which
/// also makes NVRTC check inline PTX).
pub fn compile_cubin(kernel: &str, source: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    use cudarc::nvrtc::{result, sys};
    require_nvrtc()?;
    let fail = |message: String, log: String| CudaError::Compile {
        kernel: kernel.into(),
        arch: arch.into(),
        message,
        log,
    };
    let src = CString::new(source).map_err(|e| fail(e.to_string(), String::new()))?;
    let name =
        CString::new(format!("{kernel}.cu")).map_err(|e| fail(e.to_string(), String::new()))?;
    let prog = result::create_program(&src, Some(&name))
        .map_err(|e| fail(format!("{e:?}"), String::new()))?;
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    options.extend(
        include_paths()
            .iter()
            .map(|p| format!("--include-path={}", p.display())),
    );
    // SAFETY: prog was created above and is destroyed once, at the end.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let out = match compiled {
        Err(e) => {
            // SAFETY: prog is live.
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| {
                    // SAFETY: NVRTC writes the log NUL-terminated into this buffer.
                    unsafe { CStr::from_ptr(l.as_ptr()) }
                        .to_string_lossy()
                        .into_owned()
                })
                .unwrap_or_default();
            Err(fail(format!("{e:?}"), log))
        }
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: prog compiled successfully; size is a valid out-pointer.
            unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
                .result()
                .map_err(|e| fail(format!("nvrtcGetCUBINSize: {e:?}"), String::new()))
                .and_then(|()| {
                    let mut cubin = vec![0u8; size];
                    // SAFETY: cubin has the size NVRTC reported.
                    unsafe { sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) }
                        .result()
                        .map_err(|e| fail(format!("nvrtcGetCUBIN: {e:?}"), String::new()))?;
                    Ok(cubin)
                })
        }
    };
    // SAFETY: prog is live and not used after this.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// The on-disk CUBIN cache: `$TESSERA_CUDA_CACHE`, else `$TESSERA_CACHE/cuda`, else
/// `$XDG_CACHE_HOME/tessera/cuda`, else `~/.cache/tessera/cuda`.
pub fn default_cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("TESSERA_CUDA_CACHE")
        .or_else(|| env("TESSERA_CACHE").map(|p| p.join("cuda")))
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("tessera/cuda")))
        .or_else(|| env("HOME").map(|p| p.join(".cache/tessera/cuda")))
        .unwrap_or_else(|| std::env::temp_dir().join("tessera-cuda"))
}

/// FNV-1a 64 over the parts, with separators (a cache key, not a security boundary).
fn key(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(b"\0") {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Whether the CUBIN came from the cache or was compiled now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Read from the on-disk CUBIN cache.
    Cache,
    /// Compiled by NVRTC in this call (and cached).
    Compiled,
}

/// [`compile_cubin`] through a disk cache in `dir`, keyed by the source, architecture,
/// NVRTC version and include paths. Entries are written to a unique temporary file and
/// renamed into place, so concurrent processes never read a partial CUBIN (the last
/// writer of identical bytes wins); an unreadable or non-ELF entry is recompiled.
pub fn compile_cached(
    dir: &std::path::Path,
    kernel: &str,
    source: &str,
    arch: &str,
) -> Result<(Vec<u8>, Origin), CudaError> {
    let (major, minor) = nvrtc_version()?;
    let version = format!("{major}.{minor}");
    let includes = format!("{:?}", include_paths());
    let h = key(&[
        source.as_bytes(),
        arch.as_bytes(),
        version.as_bytes(),
        includes.as_bytes(),
    ]);
    let path = dir.join(format!("{kernel}-{arch}-{h:016x}.cubin"));
    if let Ok(bytes) = std::fs::read(&path) {
        if bytes.starts_with(b"\x7fELF") {
            return Ok((bytes, Origin::Cache));
        }
    }
    let cubin = compile_cubin(kernel, source, arch)?;
    // Caching is best effort: a read-only or full disk costs a recompile next time.
    if std::fs::create_dir_all(dir).is_ok() {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{kernel}-{}-{seq}.tmp", std::process::id()));
        if std::fs::write(&tmp, &cubin).is_ok() && std::fs::rename(&tmp, &path).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok((cubin, Origin::Compiled))
}
