// C = alpha·A·B + beta·C over strided [batch, rows, cols] views: a 64×64 tile of C per
// workgroup, 16×16 invocations with 4×4 accumulators each, K in steps of 16 staged
// through workgroup memory. Out-of-range tile elements load as 0 (ragged shapes).
// A and B are 32-bit words holding f32, or two f16 or bf16 each (a_kind/b_kind: 0, 1,
// 2), widened exactly on load; the products and sums are f32 either way.

struct Params {
    m: u32,
    n: u32,
    k: u32,
    batch: u32,
    a_off: u32,
    a_sb: u32,
    a_sr: u32,
    a_sc: u32,
    b_off: u32,
    b_sb: u32,
    b_sr: u32,
    b_sc: u32,
    c_off: u32,
    c_sb: u32,
    c_sr: u32,
    c_sc: u32,
    alpha: f32,
    beta: f32,
    a_kind: u32,
    b_kind: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<u32>;
@group(0) @binding(3) var<storage, read_write> c: array<f32>;

// Element i of a buffer of the given kind from its word w (word i for f32, i/2 else).
fn widen(w: u32, i: u32, kind: u32) -> f32 {
    if (kind == 0u) {
        return bitcast<f32>(w);
    }
    let hi = (i & 1u) == 1u;
    if (kind == 1u) {
        let pair = unpack2x16float(w);
        return select(pair.x, pair.y, hi);
    }
    return bitcast<f32>(select(w << 16u, w & 0xffff0000u, hi));
}

fn load_a(i: u32) -> f32 {
    return widen(a[select(i >> 1u, i, p.a_kind == 0u)], i, p.a_kind);
}

fn load_b(i: u32) -> f32 {
    return widen(b[select(i >> 1u, i, p.b_kind == 0u)], i, p.b_kind);
}

const T: u32 = 64u;
const TK: u32 = 16u;
var<workgroup> a_tile: array<f32, 1024>; // [TK][T]
var<workgroup> b_tile: array<f32, 1024>; // [TK][T]

@compute @workgroup_size(16, 16)
fn gemm(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(local_invocation_index) li: u32,
) {
    let bt = wg.z;
    let row0 = wg.y * T;
    let col0 = wg.x * T;
    var acc: array<f32, 16>;
    for (var i = 0u; i < 16u; i = i + 1u) {
        acc[i] = 0.0;
    }
    for (var k0 = 0u; k0 < p.k; k0 = k0 + TK) {
        for (var e = 0u; e < 4u; e = e + 1u) {
            let idx = li + e * 256u;
            // A: 64 rows × 16 k.
            let ai = idx / TK;
            let ak = idx % TK;
            var av = 0.0;
            if (row0 + ai < p.m && k0 + ak < p.k) {
                av = load_a(p.a_off + bt * p.a_sb + (row0 + ai) * p.a_sr + (k0 + ak) * p.a_sc);
            }
            a_tile[ak * T + ai] = av;
            // B: 16 k × 64 columns.
            let bk = idx / T;
            let bj = idx % T;
            var bv = 0.0;
            if (k0 + bk < p.k && col0 + bj < p.n) {
                bv = load_b(p.b_off + bt * p.b_sb + (k0 + bk) * p.b_sr + (col0 + bj) * p.b_sc);
            }
            b_tile[bk * T + bj] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk = kk + 1u) {
            var ar: array<f32, 4>;
            var br: array<f32, 4>;
            for (var r = 0u; r < 4u; r = r + 1u) {
                ar[r] = a_tile[kk * T + lid.y + 16u * r];
                br[r] = b_tile[kk * T + lid.x + 16u * r];
            }
            for (var r = 0u; r < 4u; r = r + 1u) {
                for (var q = 0u; q < 4u; q = q + 1u) {
                    acc[r * 4u + q] = fma(ar[r], br[q], acc[r * 4u + q]);
                }
            }
        }
        workgroupBarrier();
    }
    for (var r = 0u; r < 4u; r = r + 1u) {
        let i = row0 + lid.y + 16u * r;
        for (var q = 0u; q < 4u; q = q + 1u) {
            let j = col0 + lid.x + 16u * q;
            if (i < p.m && j < p.n) {
                let at = p.c_off + bt * p.c_sb + i * p.c_sr + j * p.c_sc;
                var v = p.alpha * acc[r * 4u + q];
                if (p.beta != 0.0) {
                    v = v + p.beta * c[at];
                }
                c[at] = v;
            }
        }
    }
}
