//! CPU feature detection, decided once per process.
//!
//! Kernels never test CPU features themselves: they ask for an [`Isa`] and the registry
//! enumerates [`Isa::available`] to run every variant this machine can execute. The
//! environment variable `TESSERA_ISA` (scalar|avx2|avx512|neon) caps the default choice,
//! which is how one forces the portable path on a machine that has more; `TESSERA_AMX=off`
//! (or `0`) keeps the AMX tile kernels off on a CPU that has them (the AVX-512 VNNI
//! kernels run instead), to compare the two or to rule tiles out (`on`/`1`, the
//! default, uses them where granted; anything else is reported and ignored).

use std::fmt;
use std::sync::OnceLock;

/// An instruction-set level a kernel variant is compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, no target features: runs anywhere.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/DQ (plus BF16/VNNI when [`CpuFeatures`] says so).
    Avx512,
    /// aarch64 Advanced SIMD.
    Neon,
}

impl Isa {
    /// Every instruction set Tessera has kernels for, narrowest first.
    pub const ALL: [Isa; 4] = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Neon];

    /// The lower-case name (`scalar`, `avx2`, `avx512`, `neon`) used in labels and
    /// `TESSERA_ISA`.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// Whether this machine can run code compiled for `self`.
    pub fn is_available(self) -> bool {
        let f = CpuFeatures::get();
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => f.avx2_fma,
            Isa::Avx512 => f.avx512,
            Isa::Neon => f.neon,
        }
    }

    /// Every ISA this machine can run, best first.
    pub fn available() -> Vec<Isa> {
        let mut v: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.is_available()).collect();
        v.reverse();
        v
    }

    /// The ISA kernels use by default: the best available, capped by `TESSERA_ISA`.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = *Isa::available().first().unwrap_or(&Isa::Scalar);
            let Ok(s) = std::env::var("TESSERA_ISA") else {
                return best;
            };
            match s.parse::<Isa>() {
                Ok(cap) if cap.is_available() => cap,
                Ok(cap) => {
                    eprintln!(
                        "tessera: TESSERA_ISA={cap} is not available on this CPU; using {best}"
                    );
                    best
                }
                Err(_) => {
                    let names: Vec<&str> = Isa::ALL.iter().map(|i| i.name()).collect();
                    eprintln!(
                        "tessera: TESSERA_ISA='{s}' is not one of {}; using {best}",
                        names.join(", ")
                    );
                    best
                }
            }
        })
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Isa {
    type Err = crate::Error;
    fn from_str(s: &str) -> crate::Result<Self> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| crate::Error::invalid("isa", format!("unknown ISA '{s}'")))
    }
}

/// The CPU features kernels care about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuFeatures {
    /// AVX2 with FMA and F16C.
    pub avx2_fma: bool,
    /// AVX-512 F, BW, VL and DQ.
    pub avx512: bool,
    /// `vdpbf16ps` (AVX512_BF16).
    pub avx512_bf16: bool,
    /// `vpdpbusd` (AVX512_VNNI).
    pub avx512_vnni: bool,
    /// AMX tiles with 8-bit dot products (AMX-TILE + AMX-INT8), enabled by the OS and
    /// granted to this process (`arch_prctl(ARCH_REQ_XCOMP_PERM)` on Linux), beside
    /// AVX-512 and VNNI (the tile kernels finish their sums on zmm and fall back to
    /// VNNI for ragged rows).
    pub amx_int8: bool,
    /// `prefetchw`: a prefetch that fetches the line ready for writing (x86 CPUID
    /// PRFCHW; AMD since K6, Intel since Broadwell).
    pub prefetchw: bool,
    /// Arm Advanced SIMD (always on aarch64).
    pub neon: bool,
    /// Arm `sdot`/`udot` (the DotProd extension, ARMv8.2 and later).
    pub neon_dotprod: bool,
}

impl CpuFeatures {
    /// Detected once, then cached.
    pub fn get() -> &'static CpuFeatures {
        static F: OnceLock<CpuFeatures> = OnceLock::new();
        F.get_or_init(Self::detect)
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> CpuFeatures {
        use std::arch::is_x86_feature_detected as has;
        let avx2_fma = has!("avx2") && has!("fma") && has!("f16c");
        let avx512 =
            avx2_fma && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512dq");
        CpuFeatures {
            avx2_fma,
            avx512,
            avx512_bf16: avx512 && has!("avx512bf16"),
            avx512_vnni: avx512 && has!("avx512vnni"),
            amx_int8: amx_allowed() && avx512 && has!("avx512vnni") && amx_granted(),
            prefetchw: prefetchw(),
            neon: false,
            neon_dotprod: false,
        }
    }

    #[cfg(target_arch = "aarch64")]
    fn detect() -> CpuFeatures {
        use std::arch::is_aarch64_feature_detected as has;
        CpuFeatures {
            neon: has!("neon"),
            neon_dotprod: has!("neon") && has!("dotprod"),
            ..Default::default()
        }
    }

    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    fn detect() -> CpuFeatures {
        CpuFeatures::default()
    }

    /// The kernel paths this CPU cannot run, for reports that must say what stayed
    /// unverified or unmeasured here (`avx512 (no AVX-512F/BW/VL)`, `neon (not an Arm
    /// CPU)`, `vnni kernels (no AVX512_VNNI)`).
    pub fn missing_paths(&self) -> Vec<String> {
        let mut v: Vec<String> = Isa::ALL
            .into_iter()
            .filter(|i| !i.is_available())
            .map(|i| match i {
                Isa::Neon => "neon (not an Arm CPU)".to_string(),
                Isa::Avx512 if cfg!(target_arch = "x86_64") => "avx512 (no AVX-512F/BW/VL)".into(),
                Isa::Avx2 if cfg!(target_arch = "x86_64") => "avx2 (no AVX2+FMA)".into(),
                other => format!("{} (not this architecture)", other.name()),
            })
            .collect();
        if cfg!(target_arch = "x86_64") {
            if !self.avx512_vnni {
                v.push("avx512-vnni kernels (no AVX512_VNNI)".into());
            }
            if !self.avx512_bf16 {
                v.push("avx512-bf16 kernels (no AVX512_BF16)".into());
            }
            if !self.amx_int8 {
                v.push("avx512-amx kernels (no AMX-INT8 granted, or TESSERA_AMX=off)".into());
            }
        }
        if cfg!(target_arch = "aarch64") && !self.neon_dotprod {
            v.push("neon-sdot kernels (no DotProd)".into());
        }
        v
    }

    /// A one-line summary for reports (`avx512+bf16+vnni`).
    pub fn summary(&self) -> String {
        let mut s = Isa::available()
            .first()
            .copied()
            .unwrap_or(Isa::Scalar)
            .name()
            .to_string();
        if self.avx512_bf16 {
            s += "+bf16";
        }
        if self.avx512_vnni {
            s += "+vnni";
        }
        if self.amx_int8 {
            s += "+amx";
        }
        if self.neon_dotprod {
            s += "+dotprod";
        }
        s
    }
}

/// Whether `TESSERA_AMX` leaves the tile kernels on (unset, `on` or `1`); a value that
/// is none of `on`, `off`, `1`, `0` is reported and leaves them on.
#[cfg(target_arch = "x86_64")]
fn amx_allowed() -> bool {
    match std::env::var("TESSERA_AMX").as_deref() {
        Ok("off" | "0") => false,
        Ok("on" | "1") | Err(_) => true,
        Ok(other) => {
            eprintln!("tessera: TESSERA_AMX='{other}' is not one of on, off, 1, 0; tiles stay on");
            true
        }
    }
}

/// Whether the CPU has PRFCHW (CPUID leaf 0x8000_0001, ECX bit 8): `prefetchw` executes
/// as a prefetch, not an invalid opcode.
#[cfg(target_arch = "x86_64")]
fn prefetchw() -> bool {
    use std::arch::x86_64::__cpuid;
    __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
}

/// Whether this process may run AMX-INT8 tile instructions: the CPU has AMX-TILE and
/// AMX-INT8 (CPUID leaf 7, EDX bits 24 and 25), the OS saves the tile state (XCR0 bits
/// 17 and 18), and Linux granted the tile data to this process
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`; without it the first tile
/// instruction faults). Asked once, from [`CpuFeatures::get`]; the grant is
/// process-wide, so every thread of the pool may then use tiles. `std`'s
/// `is_x86_feature_detected!("amx-int8")` is not stable yet, hence the CPUID read here.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_granted() -> bool {
    use std::arch::x86_64::__cpuid_count;
    const TILE: u32 = 1 << 24;
    const INT8: u32 = 1 << 25;
    const XTILE_STATE: u32 = (1 << 17) | (1 << 18);
    const ARCH_GET_XCOMP_PERM: libc::c_long = 0x1022;
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    if __cpuid_count(0, 0).eax < 7 || __cpuid_count(7, 0).edx & (TILE | INT8) != TILE | INT8 {
        return false;
    }
    // XGETBV is valid once CPUID reports OSXSAVE (leaf 1, ECX bit 27).
    if __cpuid_count(1, 0).ecx & (1 << 27) == 0 {
        return false;
    }
    let xcr0: u32;
    // SAFETY: XGETBV with ECX = 0 reads XCR0; OSXSAVE was checked above, so it does not
    // fault. It touches no memory.
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") xcr0, out("edx") _,
            options(nomem, nostack, preserves_flags));
    }
    if xcr0 & XTILE_STATE != XTILE_STATE {
        return false;
    }
    // SAFETY: arch_prctl with an integer request and argument; it reads and writes no
    // memory of ours and returns 0 or −1.
    let req = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    // And the grant reads back (ARCH_GET_XCOMP_PERM: the permitted state components).
    let mut permitted: u64 = 0;
    // SAFETY: arch_prctl writes the u64 bitmask to the address given, a live local.
    let got = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_GET_XCOMP_PERM,
            &raw mut permitted,
        )
    };
    req == 0 && got == 0 && permitted & (1 << XFEATURE_XTILEDATA) != 0
}

#[cfg(all(target_arch = "x86_64", not(target_os = "linux")))]
fn amx_granted() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every aarch64 CPU has Advanced SIMD, so there (natively or under qemu-aarch64 in
    /// CI) the registry's variants, and so `tessera verify`, include NEON; on x86 it is
    /// never reported.
    #[test]
    fn neon_is_available_exactly_on_aarch64() {
        assert_eq!(
            Isa::available().contains(&Isa::Neon),
            cfg!(target_arch = "aarch64")
        );
        assert!(Isa::available().contains(&Isa::Scalar));
    }
}
