//! Packing: copying blocks of A and B into the panel order the micro-kernels stream.
//!
//! Packing turns any strides (row-major, transposed, padded) into unit-stride panels, so
//! transposes cost nothing in the inner loop; it converts f16 to f32 on the way, and pads
//! ragged edges with zeros so the kernel always computes a full tile.

use half::bf16;
use tessera_core::{Element, TensorView};

/// A validated strided matrix: element (r, c) lives at `ptr + r·rs + c·cs`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Mat<T> {
    pub ptr: *const T,
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

// SAFETY: Mat is a read-only window into a buffer borrowed for the whole GEMM call.
unsafe impl<T: Sync> Sync for Mat<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Send for Mat<T> {}

impl<T: Element> Mat<T> {
    /// The rank-2 matrix of `view` (dims [rows, cols]).
    pub fn of(view: &TensorView<'_, T>) -> Self {
        let l = view.layout();
        Mat {
            // SAFETY: the view was validated, so its offset is within the slice.
            ptr: unsafe { view.data().as_ptr().add(l.offset()) },
            rows: l.dim(0),
            cols: l.dim(1),
            rs: l.stride(0),
            cs: l.stride(1),
        }
    }

    /// Element (r, c), or zero outside the matrix (the padding of ragged panels).
    #[inline(always)]
    fn at_or_zero(&self, r: usize, c: usize) -> T {
        if r < self.rows && c < self.cols {
            // SAFETY: in range of a validated view, so inside the borrowed buffer.
            unsafe { *self.ptr.add(r * self.rs + c * self.cs) }
        } else {
            T::default()
        }
    }
}

/// A type the micro-kernels consume from packed panels.
///
/// # Safety
/// Implementors are 4-byte plain-old-data for which every bit pattern is valid (packing
/// buffers are shared scratch reinterpreted between f32 and u32).
pub(super) unsafe trait Packed: Copy + Default + Send + Sync + 'static {
    /// k-values per packed element.
    const KPACK: usize;
    /// The packed element holding k-values `k·KPACK ..` at logical row `r` of `m`, where
    /// `m` is either A (rows = m) or Bᵀ (rows = n).
    fn gather<T: PackSource>(m: &Mat<T>, r: usize, kstep: usize, transposed: bool) -> Self;

    /// Packs one panel with no edge (all `panel` rows and `ks` k-steps in range) along
    /// the unit-stride direction; false when this type has no such path.
    fn pack_full_panel<T: PackSource>(_m: &Mat<T>, _at: PanelAt, _out: &mut [Self]) -> bool {
        false
    }
}

/// Where a full panel starts: logical row, k, sizes, and whether rows are m's columns.
#[derive(Clone, Copy, Debug)]
pub(super) struct PanelAt {
    pub r_first: usize,
    pub k0: usize,
    pub ks: usize,
    pub panel: usize,
    pub transposed: bool,
}

/// Input element types the packers accept.
pub trait PackSource: Element {
    fn bf16_bits(self) -> u16;
}
impl PackSource for f32 {
    fn bf16_bits(self) -> u16 {
        bf16::from_f32(self).to_bits()
    }
}
impl PackSource for half::f16 {
    fn bf16_bits(self) -> u16 {
        bf16::from_f32(self.to_f32()).to_bits()
    }
}
impl PackSource for bf16 {
    fn bf16_bits(self) -> u16 {
        self.to_bits()
    }
}

#[inline(always)]
fn fetch<T: PackSource>(m: &Mat<T>, r: usize, k: usize, transposed: bool) -> T {
    if transposed {
        m.at_or_zero(k, r)
    } else {
        m.at_or_zero(r, k)
    }
}

// SAFETY: f32 is 4-byte POD.
unsafe impl Packed for f32 {
    const KPACK: usize = 1;
    #[inline(always)]
    fn gather<T: PackSource>(m: &Mat<T>, r: usize, kstep: usize, t: bool) -> Self {
        fetch(m, r, kstep, t).to_f32()
    }

    fn pack_full_panel<T: PackSource>(m: &Mat<T>, at: PanelAt, out: &mut [f32]) -> bool {
        let (stride_i, stride_k, base) = if at.transposed {
            (m.cs, m.rs, at.k0 * m.rs + at.r_first * m.cs)
        } else {
            (m.rs, m.cs, at.r_first * m.rs + at.k0 * m.cs)
        };
        let out = &mut out[..at.ks * at.panel];
        if stride_i == 1 {
            for (s, o) in out.chunks_exact_mut(at.panel).enumerate() {
                for (i, d) in o.iter_mut().enumerate() {
                    // SAFETY: the caller checked rows r_first..r_first+panel and k-values
                    // k0..k0+ks lie inside the validated matrix: the offset is in bounds.
                    *d = unsafe { *m.ptr.add(base + s * stride_k + i) }.to_f32();
                }
            }
        } else {
            match at.panel {
                4 => pack_rows::<T, 4>(m, base, (stride_i, stride_k), at.ks, out),
                6 => pack_rows::<T, 6>(m, base, (stride_i, stride_k), at.ks, out),
                8 => pack_rows::<T, 8>(m, base, (stride_i, stride_k), at.ks, out),
                _ => {
                    for i in 0..at.panel {
                        for s in 0..at.ks {
                            // SAFETY: as above.
                            out[s * at.panel + i] =
                                unsafe { *m.ptr.add(base + i * stride_i + s * stride_k) }.to_f32();
                        }
                    }
                }
            }
        }
        true
    }
}

// SAFETY: u32 is 4-byte POD.
unsafe impl Packed for u32 {
    const KPACK: usize = 2;
    #[inline(always)]
    fn gather<T: PackSource>(m: &Mat<T>, r: usize, kstep: usize, t: bool) -> Self {
        let lo = fetch(m, r, 2 * kstep, t).bf16_bits() as u32;
        let hi = fetch(m, r, 2 * kstep + 1, t).bf16_bits() as u32;
        lo | (hi << 16)
    }

    fn pack_full_panel<T: PackSource>(m: &Mat<T>, at: PanelAt, out: &mut [u32]) -> bool {
        let (stride_i, stride_k, base) = if at.transposed {
            (m.cs, m.rs, at.k0 * m.rs + at.r_first * m.cs)
        } else {
            (m.rs, m.cs, at.r_first * m.rs + at.k0 * m.cs)
        };
        let pair = |p: *const T| -> u32 {
            // SAFETY: the caller checked that both k-values of every pair in this panel are
            // inside the validated matrix (full panel: k0 + 2·ks ≤ K).
            unsafe { (*p).bf16_bits() as u32 | (((*p.add(stride_k)).bf16_bits() as u32) << 16) }
        };
        for (s, o) in out[..at.ks * at.panel]
            .chunks_exact_mut(at.panel)
            .enumerate()
        {
            for (i, d) in o.iter_mut().enumerate() {
                // SAFETY: as above; the offset addresses row i, k-value 2s of the panel.
                *d = pair(unsafe { m.ptr.add(base + i * stride_i + 2 * s * stride_k) });
            }
        }
        true
    }
}

/// Packs a full panel whose rows are strided (A row-major): R row streams read in step,
/// each k-step's R values written contiguously (no scattered stores, no bounds checks).
#[inline(always)]
fn pack_rows<T: PackSource, const R: usize>(
    m: &Mat<T>,
    base: usize,
    (stride_i, stride_k): (usize, usize),
    ks: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller checked all R rows and ks k-values of this panel are inside the
    // validated matrix, so every row pointer and offset below stays in its buffer.
    let rows: [*const T; R] = std::array::from_fn(|i| unsafe { m.ptr.add(base + i * stride_i) });
    for (s, o) in out[..ks * R].chunks_exact_mut(R).enumerate() {
        for i in 0..R {
            // SAFETY: as above.
            o[i] = unsafe { *rows[i].add(s * stride_k) }.to_f32();
        }
    }
}

/// Which block of a matrix to pack: logical rows `r0..r0+rows` (rows of A, or columns of
/// B), k-values `k0..k0+k_len`, into panels of `panel` rows.
#[derive(Clone, Copy, Debug)]
pub(super) struct Block {
    pub r0: usize,
    pub rows: usize,
    pub k0: usize,
    pub k_len: usize,
    pub panel: usize,
}

impl Block {
    pub fn k_steps<P: Packed>(&self) -> usize {
        self.k_len.div_ceil(P::KPACK)
    }
    pub fn packed_len<P: Packed>(&self) -> usize {
        self.rows.div_ceil(self.panel) * self.panel * self.k_steps::<P>()
    }
}

/// Packs `blk` of `m` into `dst` as `[panel][k_step][panel_row]`. `transposed` says the
/// logical row index is m's column index (packing B, whose logical rows are columns).
pub(super) fn pack<T: PackSource, P: Packed>(
    m: &Mat<T>,
    blk: Block,
    transposed: bool,
    dst: &mut [P],
) {
    let ks = blk.k_steps::<P>();
    let k_base = blk.k0 / P::KPACK; // k0 is a multiple of KPACK (see Blocking::round)
    let k_end = blk.k0 + blk.k_len;
    // Restrict the view to the block's k range so padding past k_len reads as zero.
    let clipped = if transposed {
        Mat {
            rows: m.rows.min(k_end),
            ..*m
        }
    } else {
        Mat {
            cols: m.cols.min(k_end),
            ..*m
        }
    };
    let row_extent = if transposed { m.cols } else { m.rows };
    let k_extent = if transposed { m.rows } else { m.cols };
    for (p, panel) in dst.chunks_exact_mut(blk.panel * ks).enumerate() {
        let r_first = blk.r0 + p * blk.panel;
        let full = r_first + blk.panel <= (blk.r0 + blk.rows).min(row_extent)
            && blk.k0 + ks * P::KPACK <= k_end.min(k_extent);
        let at = PanelAt {
            r_first,
            k0: blk.k0,
            ks,
            panel: blk.panel,
            transposed,
        };
        if full && P::pack_full_panel(m, at, panel) {
            continue;
        }
        for (s, out) in panel.chunks_exact_mut(blk.panel).enumerate() {
            for (i, o) in out.iter_mut().enumerate() {
                let r = r_first + i;
                *o = if r < blk.r0 + blk.rows {
                    P::gather(&clipped, r, k_base + s, transposed)
                } else {
                    P::default()
                };
            }
        }
    }
}
