//! FP8 E4M3/E5M2 against ml_dtypes (`scripts/reference_fp8.py`, committed output): all
//! 256 codes decode to the same f32 bits (NaN codes to NaN), and the encoder rounds every
//! reference value (random, ties, neighbours of ties, subnormals, extremes; within the
//! finite range, where both agree on semantics) to ml_dtypes' code.

use serde_json::Value;
use tessera_kernels::quant::fp8::Fp8;

#[test]
fn fp8_codecs_match_ml_dtypes() {
    let data: Value = serde_json::from_str(include_str!("data/fp8_reference.json")).unwrap();
    for (name, f) in [("e4m3", Fp8::E4M3), ("e5m2", Fp8::E5M2)] {
        let d = &data[name];
        let bits = d["decode_bits"].as_array().unwrap();
        let nan = d["decode_nan"].as_array().unwrap();
        assert_eq!(bits.len(), 256);
        for code in 0..=255u8 {
            let got = f.decode(code);
            if nan[code as usize].as_bool().unwrap() {
                assert!(got.is_nan(), "{name} {code:#04x}: {got}");
            } else {
                let want = f32::from_bits(bits[code as usize].as_u64().unwrap() as u32);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{name} {code:#04x}: {got} vs {want}"
                );
            }
        }
        let cases = d["encode"].as_array().unwrap();
        assert!(cases.len() > 2000, "{name}: {} cases", cases.len());
        for c in cases {
            let x = f32::from_bits(c[0].as_u64().unwrap() as u32);
            let want = c[1].as_u64().unwrap() as u8;
            assert_eq!(f.encode(x), want, "{name}: {x:e} ({:#010x})", x.to_bits());
        }
    }
}
