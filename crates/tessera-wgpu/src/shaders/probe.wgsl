// Ceiling probes. read_sum: each invocation sums `per` strided elements (coalesced across
// the grid). fma_chain: 8 independent FMA chains per invocation, no memory traffic.

struct Params {
    len: u32,
    per: u32,
    threads: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn read_sum(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    var s = vec4<f32>(0.0);
    var i = t;
    for (var j = 0u; j < p.per; j = j + 4u) {
        s = s + vec4<f32>(src[i], src[i + p.threads], src[i + 2u * p.threads], src[i + 3u * p.threads]);
        i = i + 4u * p.threads;
    }
    out[t] = s.x + s.y + s.z + s.w;
}

@compute @workgroup_size(64)
fn fma_chain(@builtin(global_invocation_id) gid: vec3<u32>) {
    let t = gid.x;
    let x = src[t];
    var a = vec4<f32>(x, x + 1.0, x + 2.0, x + 3.0);
    var b = vec4<f32>(x + 4.0, x + 5.0, x + 6.0, x + 7.0);
    let m = vec4<f32>(0.999);
    let c = vec4<f32>(0.001);
    for (var j = 0u; j < p.per; j = j + 1u) {
        a = fma(a, m, c);
        b = fma(b, m, c);
    }
    out[t] = a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
}
