//! FP8 codecs: E4M3 (the OCP "FN" variant: no infinities, max 448) and E5M2 (IEEE-like,
//! with ±∞), with per-tensor or per-channel f32 scales applied by the caller.
//!
//! Decoding is exact (every code's value is a small dyadic rational, exact in f32).
//! Encoding rounds to nearest, ties to even, by binary search over the 127 ordered
//! positive codes' exact values: obviously right, and fast enough for quantizing weights
//! once at load time (kernels decode through a 256-entry table). Finite values beyond
//! the largest finite code **saturate** to it (the behaviour scaled FP8 wants: an outlier
//! clips instead of becoming ∞ or NaN); E4M3 maps ±∞ to ±448, E5M2 keeps ±∞; NaN stays NaN.

/// An FP8 format: exponent/mantissa split and special values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fp8 {
    /// 4 exponent bits, 3 mantissa bits, no infinities (max 448).
    E4M3,
    /// 5 exponent bits, 2 mantissa bits (max 57344).
    E5M2,
}

impl Fp8 {
    /// The dtype tag of this format.
    pub const fn dtype(self) -> tessera_core::DType {
        match self {
            Fp8::E4M3 => tessera_core::DType::F8E4M3,
            Fp8::E5M2 => tessera_core::DType::F8E5M2,
        }
    }
    /// The format a dtype tag names, if it is an FP8 one.
    pub const fn of(dtype: tessera_core::DType) -> Option<Fp8> {
        match dtype {
            tessera_core::DType::F8E4M3 => Some(Fp8::E4M3),
            tessera_core::DType::F8E5M2 => Some(Fp8::E5M2),
            _ => None,
        }
    }

    const fn mantissa_bits(self) -> u32 {
        match self {
            Fp8::E4M3 => 3,
            Fp8::E5M2 => 2,
        }
    }
    const fn bias(self) -> i32 {
        match self {
            Fp8::E4M3 => 7,
            Fp8::E5M2 => 15,
        }
    }
    /// The largest finite positive code.
    pub const fn max_code(self) -> u8 {
        match self {
            Fp8::E4M3 => 0x7E, // S.1111.110 = 448 (S.1111.111 is NaN)
            Fp8::E5M2 => 0x7B, // S.11110.11 = 57344 (exponent 11111 is ∞/NaN)
        }
    }
    /// The largest finite value.
    pub fn max_finite(self) -> f32 {
        self.decode(self.max_code())
    }
    /// The canonical NaN code (positive).
    pub const fn nan_code(self) -> u8 {
        match self {
            Fp8::E4M3 => 0x7F,
            Fp8::E5M2 => 0x7E,
        }
    }

    /// The exact value of a code.
    pub fn decode(self, code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let mb = self.mantissa_bits();
        let e = ((code & 0x7F) >> mb) as i32;
        let m = (code & ((1 << mb) - 1)) as i32;
        let e_max = 0x7F >> mb;
        match self {
            Fp8::E4M3 if e == e_max && m == (1 << mb) - 1 => return f32::NAN,
            Fp8::E5M2 if e == e_max => {
                return if m == 0 {
                    sign * f32::INFINITY
                } else {
                    f32::NAN
                }
            }
            _ => {}
        }
        // Subnormals: m·2^(1−bias−mb); normals: (2^mb + m)·2^(e−bias−mb). Exact in f32.
        let (mant, exp) = if e == 0 {
            (m, 1 - self.bias() - mb as i32)
        } else {
            ((1 << mb) + m, e - self.bias() - mb as i32)
        };
        sign * mant as f32 * 2f32.powi(exp)
    }

    /// The nearest code (ties to even), saturating finite overflow; see the module docs.
    pub fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return self.nan_code();
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs();
        if a.is_infinite() && self == Fp8::E5M2 {
            return sign | 0x7C;
        }
        let max = self.max_code();
        if a >= self.max_finite() {
            return sign | max;
        }
        // Largest code whose value ≤ a (codes 0..=max are increasing in value).
        let (mut lo, mut hi) = (0u8, max);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if self.decode(mid) <= a {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        let (below, above) = (self.decode(lo) as f64, self.decode(lo + 1) as f64);
        let (dl, du) = (a as f64 - below, above - a as f64);
        let up = du < dl || (du == dl && lo % 2 == 1);
        sign | if up { lo + 1 } else { lo }
    }

    /// `(shift, pow)` such that [`placed`]`(code, shift, pow)` is the exact value of every
    /// finite code: the 7 magnitude bits shifted to the top of an f32 read as the value
    /// × 2^-(127−bias), subnormal codes landing on f32 subnormals with the same mantissa,
    /// and one multiply by 2^(127−bias) restores it. No table, and it vectorizes.
    pub fn placement(self) -> (u32, f32) {
        match self {
            Fp8::E4M3 => (20, 2f32.powi(120)),
            Fp8::E5M2 => (21, 2f32.powi(112)),
        }
    }

    /// A finite code's exact value by [`Fp8::placement`] (NaN/∞ codes come out finite:
    /// callers mark such rows otherwise, see `Fp8Matrix`).
    #[inline]
    pub fn decode_finite(self, code: u8) -> f32 {
        let (shift, pow) = self.placement();
        placed(code, shift, pow)
    }

    /// All 256 decoded values, for table-driven kernels.
    pub fn table(self) -> [f32; 256] {
        std::array::from_fn(|c| self.decode(c as u8))
    }
}

/// The bit placement of [`Fp8::placement`]: sign to bit 31, the other bits from `shift`.
#[inline(always)]
pub fn placed(code: u8, shift: u32, pow: f32) -> f32 {
    let c = code as u32;
    f32::from_bits(((c & 0x80) << 24) | ((c & 0x7F) << shift)) * pow
}

#[cfg(test)]
mod tests {
    use super::Fp8;

    #[test]
    fn placement_decodes_every_finite_code_exactly() {
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for c in 0..=255u8 {
                let v = f.decode(c);
                if v.is_finite() {
                    assert_eq!(f.decode_finite(c).to_bits(), v.to_bits(), "{f:?} {c:#x}");
                }
            }
        }
    }

    #[test]
    fn every_code_round_trips_and_known_values() {
        for f in [Fp8::E4M3, Fp8::E5M2] {
            for c in 0..=255u8 {
                let v = f.decode(c);
                if v.is_nan() {
                    assert!(f.decode(f.encode(v)).is_nan(), "{f:?} {c:#x}");
                    continue;
                }
                // -0 encodes back to 0x80, every finite or infinite value to its own code.
                assert_eq!(f.encode(v), c, "{f:?} code {c:#04x} value {v}");
            }
        }
        assert_eq!(Fp8::E4M3.max_finite(), 448.0);
        assert_eq!(Fp8::E5M2.max_finite(), 57344.0);
        assert_eq!(Fp8::E4M3.decode(0x01), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(Fp8::E5M2.decode(0x01), 2f32.powi(-16));
        assert_eq!(Fp8::E4M3.decode(0x38), 1.0);
        assert_eq!(Fp8::E5M2.decode(0x3C), 1.0);
        assert_eq!(Fp8::E5M2.decode(0xFC), f32::NEG_INFINITY);
    }

    #[test]
    fn rounding_ties_to_even_and_saturation() {
        let f = Fp8::E4M3;
        // Between 1.0 (0x38) and 1.125 (0x39): the midpoint goes to the even code 0x38,
        // just above it to 0x39; between 1.125 and 1.25 the midpoint goes up to 0x3A.
        assert_eq!(f.encode(1.0625), 0x38);
        assert_eq!(f.encode(1.0626), 0x39);
        assert_eq!(f.encode(1.1875), 0x3A);
        // Subnormal/normal boundary and underflow: half the smallest subnormal ties to 0.
        assert_eq!(f.encode(2f32.powi(-10)), 0x00);
        assert_eq!(f.encode(1.5 * 2f32.powi(-10)), 0x01);
        assert_eq!(f.encode(-1e-30), 0x80);
        // Saturation.
        assert_eq!(f.encode(449.0), 0x7E);
        assert_eq!(f.encode(1e30), 0x7E);
        assert_eq!(f.encode(f32::INFINITY), 0x7E);
        assert_eq!(f.encode(f32::NEG_INFINITY), 0xFE);
        assert_eq!(Fp8::E5M2.encode(1e30), 0x7B);
        assert_eq!(Fp8::E5M2.encode(f32::INFINITY), 0x7C);
        // Exhaustively on a fine grid: the chosen code is a nearest one.
        for f in [Fp8::E4M3, Fp8::E5M2] {
            let mut x = -f.max_finite();
            while x <= f.max_finite() {
                let got = f.decode(f.encode(x)) as f64;
                let err = (got - x as f64).abs();
                for c in 0..=255u8 {
                    let v = f.decode(c) as f64;
                    if v.is_finite() {
                        assert!(err <= (v - x as f64).abs(), "{f:?} x={x}: {got} vs {v}");
                    }
                }
                x += f.max_finite() / 1777.0;
            }
        }
    }
}
