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
//! the kernels drop their outputs anyway. Building it is a copy of what the quantizer
//! wrote, ~1% of a 16-row call.

use super::packed::QuantActs;
use crate::pool::{self, SharedMut};
use crate::quant::QK;

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

impl ActPanels {
    /// Refills from `acts` (each quantized for `chunks`·32 columns), reusing the buffer;
    /// `threads` copy panels in parallel once there are enough of them to pay.
    pub(super) fn refill(&mut self, acts: &[QuantActs], chunks: usize, threads: usize) {
        let panels = acts.len().div_ceil(PANEL_SLOTS);
        let words = panels * chunks * RECORD_WORDS;
        // No clearing: every word of every record is written below (empty slots with
        // zeros), so the buffer reused from the last call is not zeroed twice.
        self.words.resize(words, 0);
        (self.chunks, self.rows) = (chunks, acts.len());
        let dst = SharedMut(self.words.as_mut_ptr());
        let fill = |p: usize| {
            // SAFETY: panel p's records are the words [p·chunks·RECORD_WORDS, +
            // chunks·RECORD_WORDS), inside the buffer sized above and written by this
            // call for p alone.
            let panel = unsafe {
                std::slice::from_raw_parts_mut(
                    dst.get().add(p * chunks * RECORD_WORDS),
                    chunks * RECORD_WORDS,
                )
            };
            let rows = &acts[p * PANEL_SLOTS..acts.len().min((p + 1) * PANEL_SLOTS)];
            fill_panel(panel, rows, chunks);
        };
        // A panel's copy is ~40 ns per chunk: only prefill's dozens of panels pay for
        // the pool's wake-up.
        if panels >= 4 && threads > 1 {
            pool::global().run(panels, threads, fill);
        } else {
            (0..panels).for_each(fill);
        }
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

/// Copies up to [`PANEL_SLOTS`] rows into one panel's records and zeroes the slots past
/// them (the buffer holds an earlier call's records). A partial panel's record is zeroed
/// whole, a fixed-size store the compiler writes inline, before its rows are copied in:
/// zeroing only the empty slots' four ranges called `memset` four times per chunk, 5% of
/// a one-row 576×576 call (perf, host H).
fn fill_panel(panel: &mut [u32], rows: &[QuantActs], chunks: usize) {
    let live = rows.len();
    let (records, rest) = panel.as_chunks_mut::<RECORD_WORDS>();
    debug_assert!(rest.is_empty() && records.len() == chunks);
    for (c, rec) in records.iter_mut().enumerate() {
        if live < PANEL_SLOTS {
            *rec = [0; RECORD_WORDS];
        }
        for (s, a) in rows.iter().enumerate() {
            let q = &a.q[c * QK..][..QK];
            for (w, four) in rec[s * QK / 4..][..QK / 4]
                .iter_mut()
                .zip(q.chunks_exact(4))
            {
                *w = u32::from_ne_bytes([
                    four[0] as u8,
                    four[1] as u8,
                    four[2] as u8,
                    four[3] as u8,
                ]);
            }
            rec[INIT_AT / 4 + s] = a.block_init[c] as u32;
            rec[DX_AT / 4 + s] = a.d8[c][0].to_bits();
            rec[SUMS_AT / 4 + s] = a.block_sums[c].to_bits();
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
    use crate::ops::qmatmul::ActScales;

    fn read_i32(b: &[u8], at: usize) -> i32 {
        i32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    /// Every row's codes and metadata land at the documented offsets, and empty slots
    /// are zero.
    #[test]
    fn records_hold_each_rows_chunk() {
        let (k, m) = (96, 11);
        let mut rng = 7u64;
        let acts: Vec<QuantActs> = (0..m)
            .map(|_| {
                let x: Vec<f32> = (0..k)
                    .map(|_| {
                        rng = rng
                            .wrapping_mul(6364136223846793005)
                            .wrapping_add(1442695040888963407);
                        ((rng >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                    })
                    .collect();
                QuantActs::with_scales(&x, 8, ActScales::PerBlock)
            })
            .collect();
        // A reused buffer: first filled with more rows (and longer ones), so the empty
        // slots below must have been zeroed by the second refill, not by allocation.
        let mut panels = ActPanels::default();
        let wider: Vec<QuantActs> = (0..16)
            .map(|i| QuantActs::with_scales(&[0.25 + i as f32; 2 * 96], 8, ActScales::PerBlock))
            .collect();
        panels.refill(&wider, 2 * k / QK, 2);
        panels.refill(&acts, k / QK, 2);
        for (i, a) in acts.iter().enumerate() {
            let (rec0, slot) = panels.rows(i, 1).first_record();
            assert_eq!(slot, i % PANEL_SLOTS);
            for c in 0..k / QK {
                let rec = &rec0[c * RECORD_BYTES..][..RECORD_BYTES];
                let q: Vec<i8> = rec[QK * slot..][..QK].iter().map(|&b| b as i8).collect();
                assert_eq!(q, a.q[c * QK..][..QK]);
                assert_eq!(read_i32(rec, INIT_AT + 4 * slot), a.block_init[c]);
                let f = |at: usize| f32::from_bits(read_i32(rec, at) as u32);
                assert_eq!(f(DX_AT + 4 * slot).to_bits(), a.d8[c][0].to_bits());
                assert_eq!(f(SUMS_AT + 4 * slot).to_bits(), a.block_sums[c].to_bits());
            }
        }
        // Slots 3..8 of the second panel are past row 10.
        let (rec0, _) = panels.rows(8, 3).first_record();
        for c in 0..k / QK {
            let rec = &rec0[c * RECORD_BYTES..][..RECORD_BYTES];
            for s in 3..PANEL_SLOTS {
                assert!(rec[QK * s..][..QK].iter().all(|&b| b == 0));
                for at in [INIT_AT, DX_AT, SUMS_AT] {
                    assert_eq!(read_i32(rec, at + 4 * s), 0);
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "cross a panel")]
    fn a_pass_may_not_cross_panels() {
        let acts = vec![QuantActs::with_scales(&[0.5; 32], 0, ActScales::PerBlock); 12];
        let mut panels = ActPanels::default();
        panels.refill(&acts, 1, 1);
        let _ = panels.rows(6, 4);
    }
}
