//! Which integer dot-product kernel runs a packed matmul ([`IntKernel`]): chosen once
//! per call from the ISA asked for (`for_isa`), then refined by what the weights are
//! (`reading`: interleaved layouts and split scales take their own loops) and by the
//! activations' scales (`for_scales`: one scale per row on both sides takes the
//! row-scaled kernel). `int_path::run_int8` matches on the result; the kernels
//! themselves live in `avx2_int8`, `rows8` and `row_scaled`.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use super::{packed, row_scaled};
use super::{ActScales, PackedWeights};
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use tessera_core::CpuFeatures;
use tessera_core::Isa;

/// The integer dot-product kernel an ISA runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum IntKernel {
    /// `vpdpbusd` on ymm, 32 bytes per instruction (AVX-512 with AVX512_VNNI), the
    /// row-major loop of `avx2_int8`.
    #[cfg(target_arch = "x86_64")]
    Vnni,
    /// `vpmaddubsw` + `vpmaddwd`, 32 bytes (AVX2, and AVX-512 without VNNI).
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// `vpmaddubsw` over weights interleaved 8 rows at a time (full bytes as two nibble
    /// planes), 8 rows per call.
    #[cfg(target_arch = "x86_64")]
    Avx2Rows8,
    /// The same loop with `vpdpbusd` on ymm registers (AVX512_VNNI + AVX512VL).
    #[cfg(target_arch = "x86_64")]
    VnniRows8,
    /// The weights of [`IntKernel::VnniRows8`] on AMX tiles (`tdpbsud`), 16 weight rows
    /// by 16 activation rows per call (`rows8::amx`).
    #[cfg(target_arch = "x86_64")]
    AmxRows16,
    /// `vpmaddubsw` over Q2_K/Q3_K/Q6_K interleaved 8 rows at a time with their split
    /// scales (`rows8::planes`).
    #[cfg(target_arch = "x86_64")]
    Planes8,
    /// The same loop with `vpdpbusd` on ymm (AVX512_VNNI + AVX512VL).
    #[cfg(target_arch = "x86_64")]
    VnniPlanes8,
    /// NEON with DotProd, before `for_scales`: the row-scaled kernel where it applies,
    /// else the portable loop (the row-major block formats, Q2_K alone by default, have
    /// no NEON kernel).
    #[cfg(target_arch = "aarch64")]
    NeonDot,
    /// `sdot` over weights interleaved 8 rows at a time (`rows8`): the 4- and 5-bit
    /// formats with one scale per 32 weights, and full bytes (Q8_0, Q8_K).
    #[cfg(target_arch = "aarch64")]
    NeonRows8,
    /// `sdot` over Q2_K/Q3_K/Q6_K interleaved 8 rows at a time with their split scales
    /// (`rows8::planes`).
    #[cfg(target_arch = "aarch64")]
    NeonPlanes8,
    /// W8A8 with one scale per weight row and per activation row: integer sums over the
    /// whole row, scaled once (`row_scaled`), with the instruction given.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    RowScaled(row_scaled::Instr),
    /// The portable loop compiled for the ISA (the scalar baseline).
    Portable,
}

/// Whether a call may run [`IntKernel::AmxRows16`] where the CPU has AMX-INT8.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tiles {
    /// From [`AMX_MIN_M`] activation rows: what every public entry point (and so the
    /// engine) runs.
    Auto,
    /// Never: the vector kernels alone (the `-vnni-` registry variants).
    Off,
    /// Every call, whatever M (the `-amx-` registry variant, so verification covers
    /// the tile kernel at every shape).
    Always,
}

/// Activation rows from which [`Tiles::Auto`] takes the tile kernel: Q4_1 3072×576
/// cold on host H (AMX against the zmm VNNI loop, 2 rounds, `tessera bench qmatmul
/// --variant avx512-amx-r16|avx512-vnni-r8`) 2 rows 48–49 µs against 43–44, 4 rows
/// 51–52 against 50, 8 rows 55 against 62–63, 16 rows 73–75 against 100–102.
#[cfg(target_arch = "x86_64")]
pub(super) const AMX_MIN_M: usize = 8;

impl IntKernel {
    /// The kernel for an available `isa`.
    pub(super) fn for_isa(isa: Isa) -> Self {
        #[cfg(target_arch = "x86_64")]
        match isa {
            Isa::Avx512 if CpuFeatures::get().avx512_vnni => return IntKernel::Vnni,
            Isa::Avx512 | Isa::Avx2 if Isa::Avx2.is_available() => return IntKernel::Avx2,
            _ => {}
        }
        #[cfg(target_arch = "aarch64")]
        if isa == Isa::Neon && CpuFeatures::get().neon_dotprod {
            return IntKernel::NeonDot;
        }
        let _ = isa;
        IntKernel::Portable
    }

    /// The kernel that reads `w`'s layout: interleaved rows take the interleaved loop
    /// of the same instruction set.
    pub(super) fn reading(self, w: &PackedWeights) -> Self {
        #[cfg(target_arch = "x86_64")]
        match self {
            IntKernel::Vnni if matches!(w.meta, packed::Meta::SplitI8(_)) => {
                return IntKernel::VnniPlanes8
            }
            IntKernel::Avx2 if matches!(w.meta, packed::Meta::SplitI8(_)) => {
                return IntKernel::Planes8
            }
            IntKernel::Vnni if w.layout.interleaved() => return IntKernel::VnniRows8,
            IntKernel::Avx2 if w.layout.interleaved() => return IntKernel::Avx2Rows8,
            _ => {}
        }
        #[cfg(target_arch = "aarch64")]
        if self == IntKernel::NeonDot && w.layout.interleaved() {
            return match w.meta {
                packed::Meta::SplitI8(_) => IntKernel::NeonPlanes8,
                _ => IntKernel::NeonRows8,
            };
        }
        let _ = w;
        self
    }

    /// The tile kernel in place of the interleaved VNNI one, where `tiles` and the CPU
    /// allow it for `m` activation rows.
    pub(super) fn with_tiles(self, tiles: Tiles, m: usize) -> Self {
        #[cfg(target_arch = "x86_64")]
        if self == IntKernel::VnniRows8 && CpuFeatures::get().amx_int8 {
            let on = match tiles {
                Tiles::Auto => m >= AMX_MIN_M,
                Tiles::Off => false,
                Tiles::Always => true,
            };
            if on {
                return IntKernel::AmxRows16;
            }
        }
        let _ = (tiles, m);
        self
    }

    /// Whether the kernel reads activation panels (`act_panel`), not quantized rows.
    pub(super) fn reads_panels(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            IntKernel::Avx2Rows8 | IntKernel::VnniRows8 | IntKernel::AmxRows16 => true,
            #[cfg(target_arch = "aarch64")]
            IntKernel::NeonRows8 => true,
            _ => false,
        }
    }

    /// The row kernel of the same instruction set specialised to row scales, where
    /// weights and activations both have one scale per row (per-channel INT8 in W8A8).
    pub(super) fn for_scales(self, w: &PackedWeights, act: ActScales) -> Self {
        #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
        if act == ActScales::PerRow && w.one_scale_per_row() && w.cols() < row_scaled::MAX_COLS {
            match self {
                #[cfg(target_arch = "x86_64")]
                IntKernel::Avx2 => return IntKernel::RowScaled(row_scaled::Instr::Maddubs),
                #[cfg(target_arch = "x86_64")]
                IntKernel::Vnni => return IntKernel::RowScaled(row_scaled::Instr::Vnni),
                #[cfg(target_arch = "aarch64")]
                IntKernel::NeonDot => return IntKernel::RowScaled(row_scaled::Instr::Sdot),
                _ => {}
            }
        }
        let _ = (w, act);
        #[cfg(target_arch = "aarch64")]
        if self == IntKernel::NeonDot {
            return IntKernel::Portable;
        }
        self
    }
}
