//! Quantized activation rows interleaved for the 8-row interleaved kernels (`rows8`).
//!
//! Why a second layout: [`QuantActs`] keeps one row's arrays apart (codes, d_x, start
//! values, sums), so a kernel pass over 8 activation rows held 4 pointers per row, 32 in
//! all, for x86's 16 general registers: the compiled loop reloaded them from the stack
//! and spilled accumulators (perf annotate of a 16×3072×576 Q4_1 call, 34% of the
//! `vpdpbusd` peak). Here everything one chunk needs from [`PANEL_SLOTS`] rows is one
//! record, so the loop addresses every load as a constant offset from one pointer that
//! steps a record per chunk:
//!
//! ```text
//! record (panel p, chunk c), RECORD_BYTES = 352:
//!   [0, 256)    slot s's 32 codes at 32·s
//!   [256, 288)  slot s's start value −offset·Σq_x (i32) at 256 + 4·s
//!   [288, 320)  slot s's d_x (f32)
//!   [320, 352)  slot s's d_x·Σq_x (f32, the minimum term)
//! ```
//!
//! Slots past the last row are zero (codes, start, d_x and sums), so they add nothing;
//! the kernels drop their outputs anyway. The quantizers write the records in place
//! ([`PanelSlot`]), each thread its own rows.

use super::quant_acts::BlockSink;
#[cfg(doc)]
use super::quant_acts::QuantActs;
use crate::pool::{self, SharedMut};
use crate::quant::QK;
use std::marker::PhantomData;

/// Activation rows per panel: the VNNI kernel's rows per pass (`rows8::VNNI_M`), two of
/// the AVX2 kernel's.
pub(super) const PANEL_SLOTS: usize = 8;
/// Offset of the start values in a record.
pub(super) const INIT_AT: usize = PANEL_SLOTS * QK;
/// Offset of the d_x values in a record.
pub(super) const DX_AT: usize = INIT_AT + 4 * PANEL_SLOTS;
/// Offset of the minimum terms in a record.
pub(super) const SUMS_AT: usize = DX_AT + 4 * PANEL_SLOTS;
/// Bytes of one (panel, chunk) record.
pub(super) const RECORD_BYTES: usize = SUMS_AT + 4 * PANEL_SLOTS;
const RECORD_WORDS: usize = RECORD_BYTES / 4;

/// Activation rows in panels of [`PANEL_SLOTS`], one record per 32-column chunk.
#[derive(Debug, Default)]
pub(super) struct ActPanels {
    /// 4-byte words, so every record (a multiple of 4 bytes) keeps i32/f32 alignment.
    words: Vec<u32>,
    chunks: usize,
    rows: usize,
}

/// Where a kernel pass reads its activation rows: the first record of `slot` in a
/// panel, and how many rows from there are real.
#[derive(Clone, Copy, Debug)]
pub(super) struct PanelRows<'a> {
    panels: &'a ActPanels,
    panel: usize,
    slot: usize,
    live: usize,
}

/// One activation row's slot in the panels, where the quantizers write it block by
/// block ([`BlockSink`]): its codes and metadata in place in the records the kernels
/// read. Made by [`ActPanels::quantize_rows`] alone, one per row, each handed to one
/// task, so the bytes a slot writes are written through it alone.
pub(super) struct PanelSlot<'a> {
    /// The slot's panel's first record.
    records: *mut u32,
    slot: usize,
    chunks: usize,
    _panels: PhantomData<&'a mut [u32]>,
}

impl BlockSink for PanelSlot<'_> {
    fn holds(&self, k: usize) -> bool {
        k / QK <= self.chunks
    }

    #[inline(always)]
    fn codes(&mut self, b: usize) -> &mut [i8; QK] {
        assert!(b < self.chunks, "chunk {b} of {}", self.chunks);
        // SAFETY: record b of the slot's panel lies in the buffer (`quantize_rows` sized
        // it for `chunks` records a panel); the slot's 32 code bytes at 32·slot are
        // written through this slot alone (its doc), and a record is 4-byte aligned.
        unsafe {
            &mut *self
                .records
                .add(b * RECORD_WORDS + self.slot * QK / 4)
                .cast()
        }
    }

    #[inline(always)]
    fn finish(&mut self, b: usize, d: f32, sums: [i32; 8], offset: i32) {
        assert!(b < self.chunks, "chunk {b} of {}", self.chunks);
        // As `QuantActs::finish_sums` computes `block_init` and `block_sums`.
        let total: i32 = sums.iter().sum();
        let values = [
            (-offset * total) as u32,
            d.to_bits(),
            (d * total as f32).to_bits(),
        ];
        for (at, v) in [INIT_AT, DX_AT, SUMS_AT].into_iter().zip(values) {
            // SAFETY: as in `codes`: inside record b, the slot's own word of each array.
            unsafe { *self.records.add(b * RECORD_WORDS + at / 4 + self.slot) = v };
        }
    }
}

impl ActPanels {
    /// Refills the panels with `items` input rows' activations, `N` rows each (one for
    /// 8-bit activations, two planes for 16-bit): `quantize(i, slots)` writes input row
    /// i's into `slots` (rows N·i..N·i + N), every row of `k` values (a multiple of 32).
    /// The quantizers write the records in place, on `threads` in contiguous runs of
    /// input rows (`pool::row_runs`): one dispatch where a separate copy of quantized
    /// rows into panels, serial on the caller below 4 panels, was 2.6% of a
    /// 16×3072×576 Q4_1 call and left the other thread spinning (perf, host C).
    pub(super) fn quantize_rows<const N: usize>(
        &mut self,
        (items, k): (usize, usize),
        threads: usize,
        quantize: impl Fn(usize, &mut [PanelSlot<'_>; N]) + Sync,
    ) {
        let (rows, chunks) = (N * items, k / QK);
        let panel_words = chunks * RECORD_WORDS;
        let panels = rows.div_ceil(PANEL_SLOTS);
        // No clearing: every row's slot is written below, and the empty slots zeroed.
        self.words.resize(panels * panel_words, 0);
        (self.chunks, self.rows) = (chunks, rows);
        if !rows.is_multiple_of(PANEL_SLOTS) {
            // The slots past the last row must read zero (the buffer holds an earlier
            // call's records): that panel's records are zeroed whole before its rows are
            // written, a fixed-size store the compiler writes inline. Zeroing only the
            // empty slots' four ranges called `memset` four times per chunk, 5% of a
            // one-row 576×576 call (perf, host H).
            let last = &mut self.words[(panels - 1) * panel_words..];
            last.as_chunks_mut::<RECORD_WORDS>()
                .0
                .iter_mut()
                .for_each(|rec| *rec = [0; RECORD_WORDS]);
        }
        let base = SharedMut(self.words.as_mut_ptr());
        let slot = |row: usize| PanelSlot {
            // SAFETY: row < rows, so its panel's records lie in the buffer sized above.
            records: unsafe { base.get().add(row / PANEL_SLOTS * panel_words) },
            slot: row % PANEL_SLOTS,
            chunks,
            _panels: PhantomData,
        };
        let (tasks, per) = pool::row_runs(items, k, threads);
        let run = |t: usize| {
            for i in t * per..((t + 1) * per).min(items) {
                quantize(i, &mut std::array::from_fn(|j| slot(N * i + j)));
            }
        };
        if tasks <= 1 {
            run(0);
        } else {
            pool::global().run(tasks, threads, run);
        }
    }

    /// The activation rows the panels hold.
    pub(super) fn len(&self) -> usize {
        self.rows
    }

    /// Rows `m0..m0 + live` for a kernel pass: they must lie in one panel.
    pub(super) fn rows(&self, m0: usize, live: usize) -> PanelRows<'_> {
        let (panel, slot) = (m0 / PANEL_SLOTS, m0 % PANEL_SLOTS);
        assert!(
            live >= 1 && slot + live <= PANEL_SLOTS && m0 + live <= self.rows,
            "activation rows {m0}..{} cross a panel or pass the {} rows",
            m0 + live,
            self.rows
        );
        PanelRows {
            panels: self,
            panel,
            slot,
            live,
        }
    }
}

impl<'a> PanelRows<'a> {
    /// Real rows in this pass (the rest of the pass reads zero or later slots).
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// The 32-column chunks of every row.
    pub(super) fn chunks(&self) -> usize {
        self.panels.chunks
    }

    /// The first `n` rows and the rest (1 ≤ n < live), each a pass of its own.
    pub(super) fn split(self, n: usize) -> (Self, Self) {
        assert!(n >= 1 && n < self.live, "split {n} of {} rows", self.live);
        let rest = PanelRows {
            slot: self.slot + n,
            live: self.live - n,
            ..self
        };
        (PanelRows { live: n, ..self }, rest)
    }

    /// This pass's first record (chunk 0) as bytes, and the byte offset of its first
    /// slot within a record. A pass of M rows reads slots `slot..slot + M` of each
    /// record; the kernel's M may exceed `live` as long as `slot + M ≤ PANEL_SLOTS`.
    #[inline]
    pub(super) fn first_record(&self) -> (&'a [u8], usize) {
        let words = &self.panels.words[self.panel * self.panels.chunks * RECORD_WORDS..]
            [..self.panels.chunks * RECORD_WORDS];
        // SAFETY: reinterpreting initialized u32s as bytes (alignment 1, 4× the length).
        let bytes =
            unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 4) };
        (bytes, self.slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::qmatmul::quant_acts::{quantize_into, QuantActs};
    use crate::ops::qmatmul::ActScales;
    use tessera_core::Isa;

    fn read_i32(b: &[u8], at: usize) -> i32 {
        i32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn random_rows(rows: usize, k: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = seed;
        (0..rows)
            .map(|_| {
                (0..k)
                    .map(|_| {
                        rng = rng
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((rng >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                    })
                    .collect()
            })
            .collect()
    }

    /// Every row's codes and metadata sit at the documented offsets with the values
    /// the same quantizer writes into a [`QuantActs`] (`want`, one per panel row), and
    /// the slots past the last row are zero.
    fn assert_records(panels: &ActPanels, want: &[QuantActs], k: usize) {
        for (i, a) in want.iter().enumerate() {
            let (rec0, slot) = panels.rows(i, 1).first_record();
            assert_eq!(slot, i % PANEL_SLOTS);
            for c in 0..k / QK {
                let rec = &rec0[c * RECORD_BYTES..][..RECORD_BYTES];
                let q: Vec<i8> = rec[QK * slot..][..QK].iter().map(|&b| b as i8).collect();
                assert_eq!(q, a.q[c * QK..][..QK], "row {i} chunk {c}");
                assert_eq!(read_i32(rec, INIT_AT + 4 * slot), a.block_init[c]);
                let f = |at: usize| f32::from_bits(read_i32(rec, at) as u32);
                assert_eq!(f(DX_AT + 4 * slot).to_bits(), a.d8[c][0].to_bits());
                assert_eq!(f(SUMS_AT + 4 * slot).to_bits(), a.block_sums[c].to_bits());
            }
        }
        let (rows, last) = (want.len(), want.len() / PANEL_SLOTS * PANEL_SLOTS);
        if last < rows {
            let (rec0, _) = panels.rows(last, rows - last).first_record();
            for c in 0..k / QK {
                let rec = &rec0[c * RECORD_BYTES..][..RECORD_BYTES];
                for s in rows - last..PANEL_SLOTS {
                    assert!(rec[QK * s..][..QK].iter().all(|&b| b == 0), "slot {s}");
                    for at in [INIT_AT, DX_AT, SUMS_AT] {
                        assert_eq!(read_i32(rec, at + 4 * s), 0, "slot {s}");
                    }
                }
            }
        }
    }

    /// 8-bit rows written in place: on one task (11 rows at K = 96) and on two whose
    /// runs split the first panel (11 rows at K = 416, 6 and 5 rows), into a buffer
    /// first filled with more and longer rows, so the empty slots must have been
    /// zeroed by the refill, not by allocation.
    #[test]
    fn quantized_rows_land_in_their_slots() {
        for (k, m) in [(96, 11), (416, 11), (416, 16), (64, 1)] {
            let xs = random_rows(m, k, k as u64 + m as u64);
            let mut panels = ActPanels::default();
            panels.quantize_rows::<1>((16, 2 * k), 2, |_, [s]| {
                quantize_into(Isa::best(), &vec![0.75; 2 * k], 8, ActScales::PerBlock, s)
            });
            panels.quantize_rows::<1>((m, k), 2, |i, [s]| {
                quantize_into(Isa::best(), &xs[i], 8, ActScales::PerBlock, s)
            });
            let want: Vec<QuantActs> = xs
                .iter()
                .map(|x| QuantActs::with_scales(x, 8, ActScales::PerBlock))
                .collect();
            assert_records(&panels, &want, k);
        }
    }

    /// 16-bit activations' two planes per input row: rows 2i and 2i + 1, as
    /// `QuantActs::refill_split` makes them: 5 input rows on one task, 9 on two (rows
    /// 0..10 and 10..18, the second panel split).
    #[test]
    fn split_planes_land_in_pairs_of_slots() {
        for (k, m) in [(96, 5), (480, 9)] {
            let xs = random_rows(m, k, 3);
            let mut panels = ActPanels::default();
            panels.quantize_rows::<2>((m, k), 2, |i, [hi, lo]| {
                super::super::act16::split_into(Isa::best(), &xs[i], 0, hi, lo)
            });
            let want: Vec<QuantActs> = xs
                .iter()
                .flat_map(|x| {
                    let (mut hi, mut lo) = Default::default();
                    QuantActs::refill_split(&mut hi, &mut lo, x, 0);
                    [hi, lo]
                })
                .collect();
            assert_records(&panels, &want, k);
        }
    }

    #[test]
    #[should_panic(expected = "cross a panel")]
    fn a_pass_may_not_cross_panels() {
        let mut panels = ActPanels::default();
        panels.quantize_rows::<1>((12, 32), 1, |_, [s]| {
            quantize_into(Isa::best(), &[0.5; 32], 0, ActScales::PerBlock, s)
        });
        let _ = panels.rows(6, 4);
    }
}
