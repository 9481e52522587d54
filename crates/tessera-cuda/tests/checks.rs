//! The launchers' argument checks (no GPU needed): bad shapes, short buffers, size
//! overflow, invalid block tables and context lengths are errors, never launches.

use tessera_cuda::checks;
use tessera_cuda::ops::{AttentionShape, GemmShape, PagedShape};

#[test]
fn gemm_checks() {
    let s = |m, n, k| GemmShape {
        m,
        n,
        k,
        alpha: 1.0,
    };
    assert!(checks::gemm(&s(3, 5, 8), 24, 40, 15).is_ok());
    assert!(
        checks::gemm(&s(3, 5, 7), 21, 35, 15).is_err(),
        "K not a multiple of 8"
    );
    assert!(checks::gemm(&s(0, 5, 8), 0, 40, 0).is_err(), "empty M");
    assert!(checks::gemm(&s(3, 5, 8), 23, 40, 15).is_err(), "short A");
    assert!(checks::gemm(&s(3, 5, 8), 24, 40, 14).is_err(), "short C");
    let huge = usize::MAX / 4;
    assert!(
        checks::gemm(&s(huge, 8, 8), usize::MAX, usize::MAX, usize::MAX).is_err(),
        "overflow"
    );
    assert!(
        checks::gemm(&s(1 << 31, 1, 8), 1 << 34, 8, 1 << 31).is_err(),
        "M beyond int"
    );
}

#[test]
fn attention_checks() {
    let ok = AttentionShape {
        batch: 2,
        sq: 3,
        sk: 5,
        heads: 4,
        kv_heads: 2,
        d: 64,
        causal: true,
        scale: 0.1,
    };
    let (q, kv) = (2 * 3 * 4 * 64, 2 * 5 * 2 * 64);
    assert!(checks::attention(&ok, q, kv, kv, q).is_ok());
    assert!(checks::attention(&AttentionShape { d: 96, ..ok }, q, kv, kv, q).is_err());
    assert!(checks::attention(&AttentionShape { kv_heads: 3, ..ok }, q, kv, kv, q).is_err());
    assert!(checks::attention(&AttentionShape { kv_heads: 0, ..ok }, q, kv, kv, q).is_err());
    assert!(checks::attention(&AttentionShape { heads: 0, ..ok }, q, kv, kv, q).is_err());
    assert!(checks::attention(&ok, q, kv - 1, kv, q).is_err());
}

#[test]
fn paged_checks_and_plan() {
    let s = PagedShape {
        heads: 8,
        kv_heads: 2,
        d: 128,
        block_size: 16,
        num_blocks: 10,
        scale: 0.1,
        chunk: 0,
    };
    let cache = 10 * 16 * 2 * 128;
    let lens = [20usize, 33];
    let tables = [0u32, 1, 9, 2, 3, 4];
    let bufs = |seqs: usize| (seqs * 8 * 128, cache, cache, seqs * 8 * 128);
    let plan = checks::paged(&s, &tables, &lens, bufs(2)).expect("valid");
    assert_eq!((plan.seqs, plan.max_blocks), (2, 3));
    // 2 seqs × 8 heads = 16 blocks per split, so 17 splits would fill the GPU, but a
    // split holds at least 64 tokens: one split covers the longest (33) context.
    assert_eq!((plan.chunk, plan.splits), (64, 1));
    let fixed = checks::paged(&PagedShape { chunk: 16, ..s }, &tables, &lens, bufs(2)).unwrap();
    assert_eq!(fixed.splits, 3);
    // A block id out of range, but only where a length reaches it.
    let mut bad = tables;
    bad[4] = 10;
    assert!(checks::paged(&s, &bad, &lens, bufs(2)).is_err());
    let mut unused = tables;
    unused[5] = 99; // at 20 tokens sequence 1 reads table entries 3 and 4 only
    assert!(checks::paged(&s, &unused, &[20, 20], bufs(2)).is_ok());
    // Lengths beyond the table, empty sequences, ragged tables, odd or huge d, no heads.
    assert!(checks::paged(&s, &tables, &[20, 49], bufs(2)).is_err());
    assert!(checks::paged(&s, &tables, &[20, 0], bufs(2)).is_err());
    assert!(checks::paged(&s, &tables[..5], &lens, bufs(2)).is_err());
    assert!(checks::paged(&s, &tables, &[], bufs(0)).is_err());
    assert!(checks::paged(&PagedShape { d: 130, ..s }, &tables, &lens, bufs(2)).is_err());
    assert!(checks::paged(&PagedShape { d: 512, ..s }, &tables, &lens, bufs(2)).is_err());
    assert!(checks::paged(&PagedShape { heads: 0, ..s }, &tables, &lens, bufs(2)).is_err());
    // Short buffers.
    let (q, k, v, o) = bufs(2);
    assert!(checks::paged(&s, &tables, &lens, (q - 1, k, v, o)).is_err());
    assert!(checks::paged(&s, &tables, &lens, (q, k, v - 1, o)).is_err());
}

#[test]
fn qmatvec_checks() {
    assert!(checks::qmatvec_i8((2, 12), 24, 2, 12, 2).is_ok());
    assert!(checks::qmatvec_i8((2, 10), 20, 2, 10, 2).is_err(), "K % 4");
    assert!(
        checks::qmatvec_i8((2, 12), 24, 1, 12, 2).is_err(),
        "one scale per row"
    );
}
