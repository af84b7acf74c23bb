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
    // Without an entropy source (a sandbox that denies getrandom), the time and the process id
    // still differ between processes and runs.
    getrandom::u64().unwrap_or_else(|_| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        splitmix64(now.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32))
    })
}

/// The stream that keys unseeded rows. Shared by every thread that uses the sampler.
pub struct KeyStream {
    state: Mutex<StreamState>,
}

struct StreamState {
    rng: Xoshiro256PlusPlus,
    /// How many keys the stream has handed out.
    taken: u64,
}

/// Keys a call took from a [`KeyStream`]: what it needs to give them back if it fails.
pub(crate) struct TakenKeys {
    /// The generator before the keys were taken.
    before: Xoshiro256PlusPlus,
    /// The stream's count of keys before and after.
    from: u64,
    to: u64,
}

impl KeyStream {
    pub fn new(seed: u64) -> Self {
        KeyStream { state: Mutex::new(StreamState { rng: Xoshiro256PlusPlus::seed_from_u64(seed), taken: 0 }) }
    }

    /// Fills `keys` with the next keys of the stream, in order, under one lock; returns what
    /// [`KeyStream::give_back`] needs to undo it.
    pub(crate) fn take_keys(&self, keys: &mut [u64]) -> TakenKeys {
        let mut st = self.state.lock();
        let (before, from) = (st.rng.clone(), st.taken);
        for k in keys.iter_mut() {
            *k = st.rng.next_u64();
        }
        st.taken += keys.len() as u64;
        TakenKeys { before, from, to: st.taken }
    }

    /// Puts back keys a refused call took, so that the next call gets them as if the refused one
    /// had never run. Possible only while nobody has taken keys since (calls give back in the
    /// reverse order of their takes): otherwise the keys stay taken, and false is returned.
    pub(crate) fn give_back(&self, taken: TakenKeys) -> bool {
        let mut st = self.state.lock();
        if st.taken != taken.to {
            return false;
        }
        st.rng = taken.before;
        st.taken = taken.from;
        true
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
        let _ = a.take_keys(&mut ka);
        let _ = b.take_keys(&mut kb[..2]);
        let _ = b.take_keys(&mut kb[2..]);
        assert_eq!(ka, kb);
    }

    #[test]
    fn keys_given_back_are_taken_again() {
        let (a, b) = (KeyStream::new(9), KeyStream::new(9));
        let (mut ka, mut kb, mut refused) = ([0u64; 3], [0u64; 3], [0u64; 5]);
        let first = a.take_keys(&mut refused[..2]);
        let second = a.take_keys(&mut refused[2..]);
        assert!(a.give_back(second));
        assert!(a.give_back(first));
        let _ = a.take_keys(&mut ka);
        let _ = b.take_keys(&mut kb);
        assert_eq!(ka, kb);
        // Once another call took keys, the earlier ones stay taken.
        let late = a.take_keys(&mut refused[..1]);
        let _ = a.take_keys(&mut ka);
        assert!(!a.give_back(late));
    }
}
