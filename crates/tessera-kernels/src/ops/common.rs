//! Helpers shared by op descriptors: random inputs, widening, poisoning.

use crate::registry::Rng;
use rand::Rng as _;
use tessera_core::{AlignedVec, Element, Result};

/// `n` values uniform in [-1, 1) rounded to `T` (never an all-zero buffer).
pub fn random<T: Element>(rng: &mut Rng, n: usize) -> Result<AlignedVec<T>> {
    let mut v = AlignedVec::<T>::zeroed(n)?;
    v.iter_mut()
        .for_each(|x| *x = T::from_f64(rng.random_range(-1.0..1.0)));
    Ok(v)
}

/// `n` values uniform in [lo, hi).
pub fn random_in<T: Element>(rng: &mut Rng, n: usize, lo: f64, hi: f64) -> Result<AlignedVec<T>> {
    let mut v = AlignedVec::<T>::zeroed(n)?;
    v.iter_mut()
        .for_each(|x| *x = T::from_f64(rng.random_range(lo..hi)));
    Ok(v)
}

/// Widen to f64.
pub fn widen<T: Element>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Fill with NaN.
pub fn poison<T: Element>(v: &mut [T]) {
    v.fill(T::from_f32(f32::NAN));
}

/// Bytes of a slice.
pub fn bytes<T>(v: &[T]) -> usize {
    std::mem::size_of_val(v)
}
