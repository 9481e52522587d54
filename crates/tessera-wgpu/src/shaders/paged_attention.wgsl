// Attention over a paged KV cache: one workgroup of 64 per (query row, head); the row's
// visible positions in tiles of 64 with the online-softmax recurrence (see paged.rs).

struct Params {
    rows: u32,
    heads: u32,
    kv_heads: u32,
    d: u32,
    block_size: u32,
    max_blocks: u32,
    scale: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<f32>;
@group(0) @binding(3) var<storage, read> vc: array<f32>;
// Per query row its sequence and visible range [start, end), then every sequence's block
// table (max_blocks ids).
@group(0) @binding(4) var<storage, read> seq_info: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const WG: u32 = 64u;
const LOWEST: f32 = -3.4028235e38;

var<workgroup> qs: array<f32, 256>;
var<workgroup> acc: array<f32, 256>;
var<workgroup> pr: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> wrange: vec2<u32>;

fn reduce(lid: u32, v: f32, is_max: bool) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            if (is_max) {
                red[lid] = max(red[lid], red[lid + s]);
            } else {
                red[lid] = red[lid] + red[lid + s];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

// Element offset of position t's row for KV head kvh, through the sequence's table.
fn row_of(table: u32, t: u32, kvh: u32) -> u32 {
    let b = seq_info[table + t / p.block_size];
    return ((b * p.block_size + t % p.block_size) * p.kv_heads + kvh) * p.d;
}

@compute @workgroup_size(64)
fn paged_attention(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let item = wg.x + wg.y * 65535u;
    if (item >= p.rows * p.heads) {
        return;
    }
    let lid = lid3.x;
    let row = item / p.heads;
    let kvh = (item % p.heads) / (p.heads / p.kv_heads);
    let table = 3u * p.rows + seq_info[3u * row] * p.max_blocks;
    if (lid == 0u) {
        wrange = vec2<u32>(seq_info[3u * row + 1u], seq_info[3u * row + 2u]);
    }
    let range = workgroupUniformLoad(&wrange);
    let len = range.y;
    for (var x = lid; x < p.d; x = x + WG) {
        qs[x] = q[item * p.d + x] * p.scale;
        acc[x] = 0.0;
    }
    workgroupBarrier();
    var m = LOWEST;
    var l = 0.0;
    for (var t0 = range.x; t0 < len; t0 = t0 + WG) {
        let t = t0 + lid;
        let valid = t < len;
        var score = LOWEST;
        if (valid) {
            let krow = row_of(table, t, kvh);
            var dot = 0.0;
            for (var x = 0u; x < p.d; x = x + 1u) {
                dot = dot + qs[x] * kc[krow + x];
            }
            score = dot;
        }
        let m_new = max(m, reduce(lid, score, true));
        let alpha = exp(m - m_new);
        var e = 0.0;
        if (valid) {
            e = exp(score - m_new);
        }
        pr[lid] = e;
        l = l * alpha + reduce(lid, e, false);
        let count = min(WG, len - t0);
        for (var x = lid; x < p.d; x = x + WG) {
            var a = acc[x] * alpha;
            for (var j = 0u; j < count; j = j + 1u) {
                a = a + pr[j] * vc[row_of(table, t0 + j, kvh) + x];
            }
            acc[x] = a;
        }
        m = m_new;
        workgroupBarrier();
    }
    // An empty range (a zero window) attends to nothing: zeros, not 0/0.
    let empty = range.x >= len;
    for (var x = lid; x < p.d; x = x + WG) {
        out[item * p.d + x] = select(acc[x] / l, 0.0, empty);
    }
}
