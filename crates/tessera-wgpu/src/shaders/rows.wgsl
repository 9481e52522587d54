// Row-wise ops: one workgroup of 256 invocations per row, reductions through workgroup
// memory. Rows beyond 65535 continue in the dispatch's y dimension.

struct Params {
    rows: u32,
    n: u32,
    eps: f32,
    // RoPE's heads per token (0 for the other ops).
    heads: u32,
    // Where in `out` the rows start.
    out_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x0: array<f32>;
// The second input: SwiGLU's up, add's b, RMSNorm's gamma, RoPE's cos/sin table (unused by softmax).
@group(0) @binding(2) var<storage, read> x1: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const WG: u32 = 256u;
var<workgroup> red: array<f32, 256>;

fn reduce_sum(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] = red[lid] + red[lid + s];
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn reduce_max(lid: u32, v: f32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.x + wg.y * 65535u;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var s = 0.0;
    for (var i = lid.x; i < p.n; i = i + WG) {
        let v = x0[base + i];
        s = s + v * v;
    }
    let ms = reduce_sum(lid.x, s) / f32(p.n);
    let r = 1.0 / sqrt(ms + p.eps);
    for (var i = lid.x; i < p.n; i = i + WG) {
        out[p.out_off + base + i] = x0[base + i] * r * x1[i];
    }
}

@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = wg.x + wg.y * 65535u;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var m = -3.4028235e38;
    for (var i = lid.x; i < p.n; i = i + WG) {
        m = max(m, x0[base + i]);
    }
    m = reduce_max(lid.x, m);
    var s = 0.0;
    for (var i = lid.x; i < p.n; i = i + WG) {
        let e = exp(x0[base + i] - m);
        out[p.out_off + base + i] = e;
        s = s + e;
    }
    let inv = 1.0 / reduce_sum(lid.x, s);
    for (var i = lid.x; i < p.n; i = i + WG) {
        out[p.out_off + base + i] = out[p.out_off + base + i] * inv;
    }
}

@compute @workgroup_size(256)
fn swiglu(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * 65535u * WG;
    if (i >= p.rows * p.n) {
        return;
    }
    let g = x0[i];
    out[p.out_off + i] = g / (1.0 + exp(-g)) * x1[i];
}

@compute @workgroup_size(256)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * 65535u * WG;
    if (i >= p.rows * p.n) {
        return;
    }
    out[p.out_off + i] = x0[i] + x1[i];
}

// RoPE: one invocation per rotated pair. Row r is head r % heads of token r / heads; the
// table holds every token's n/2 cosines, then every token's n/2 sines.
fn rope_pair(q: u32, half_split: bool) {
    let half = p.n / 2u;
    let row = q / half;
    let i = q % half;
    let t = row / p.heads;
    let tokens = p.rows / p.heads;
    let c = x1[t * half + i];
    let s = x1[(tokens + t) * half + i];
    var a = row * p.n + 2u * i;
    var b = a + 1u;
    if (half_split) {
        a = row * p.n + i;
        b = a + half;
    }
    let xa = x0[a];
    let xb = x0[b];
    out[p.out_off + a] = xa * c - xb * s;
    out[p.out_off + b] = xa * s + xb * c;
}

@compute @workgroup_size(256)
fn rope(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = gid.x + gid.y * 65535u * WG;
    if (q >= p.rows * (p.n / 2u)) {
        return;
    }
    rope_pair(q, false);
}

@compute @workgroup_size(256)
fn rope_neox(@builtin(global_invocation_id) gid: vec3<u32>) {
    let q = gid.x + gid.y * 65535u * WG;
    if (q >= p.rows * (p.n / 2u)) {
        return;
    }
    rope_pair(q, true);
}
