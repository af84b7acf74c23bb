//! Random streams and noise.
//!
//! Every noise value tokenrace generates is counter-based: the value of token i in a row is a
//! pure function of the row's 64-bit key and i (see `kernels::generic::noise::hash`). Seeded rows take
//! their key from (seed, offset); unseeded rows take one fresh key each from the sampler's
//! xoshiro256++ stream, in row order, so no token depends on the thread count or SIMD level.

pub mod pool;

use parking_lot::Mutex;
use rand_xoshiro::rand_core::{Rng, SeedableRng};
use rand_xoshiro::Xoshiro256PlusPlus;

/// SplitMix64's output function (defined with the kernels, which derive the block streams' keys
/// with it).
pub use crate::kernels::generic::noise::splitmix64;

/// The key of a seeded row: a pure function of (seed, offset).
pub fn seeded_row_key(seed: u64, offset: u64) -> u64 {
    splitmix64(splitmix64(seed) ^ offset)
}

/// A seed from OS entropy.
pub fn entropy_seed() -> u64 {
    rand::random::<u64>()
}

/// The stream that keys unseeded rows. Shared by every thread that uses the sampler.
pub struct KeyStream {
    rng: Mutex<Xoshiro256PlusPlus>,
}

impl KeyStream {
    pub fn new(seed: u64) -> Self {
        KeyStream { rng: Mutex::new(Xoshiro256PlusPlus::seed_from_u64(seed)) }
    }

    /// Fills `keys` with the next keys of the stream, in order, under one lock.
    pub fn next_keys(&self, keys: &mut [u64]) {
        let mut rng = self.rng.lock();
        for k in keys {
            *k = rng.next_u64();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_keys_depend_on_seed_and_offset() {
        assert_ne!(seeded_row_key(1, 0), seeded_row_key(1, 1));
        assert_ne!(seeded_row_key(1, 0), seeded_row_key(2, 0));
        assert_eq!(seeded_row_key(7, 3), seeded_row_key(7, 3));
    }

    #[test]
    fn key_stream_is_reproducible() {
        let (a, b) = (KeyStream::new(5), KeyStream::new(5));
        let (mut ka, mut kb) = ([0u64; 4], [0u64; 4]);
        a.next_keys(&mut ka);
        b.next_keys(&mut kb[..2]);
        b.next_keys(&mut kb[2..]);
        assert_eq!(ka, kb);
    }
}
