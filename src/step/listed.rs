//! The table of the kept tokens the logit bias names: each with its summed bias and whether a
//! -inf bias bans it, found in a probe or two.

use crate::alloc;
use crate::error::Result;

/// The kept tokens that the bias names, with their biases: an open-addressing table (linear
/// probing) of at least twice as many slots as names, so that a lookup costs a probe or two.
pub(super) struct Listed {
    pub slots: Vec<Slot>,
    /// `32 - log2(slots.len())`: a slot index is the top bits of a multiplicative hash.
    shift: u32,
}

#[derive(Clone, Copy)]
pub(super) struct Slot {
    /// The token, or [`Slot::FREE`].
    pub id: u32,
    pub bias: f32,
    pub has_bias: bool,
    pub banned: bool,
    /// DRY's penalty (0: none), subtracted after every other penalty.
    pub dry: f32,
}

impl Slot {
    pub const FREE: u32 = u32::MAX;
}

impl Listed {
    /// An empty table, keeping `slots` (reused storage) for [`Listed::with_room`].
    pub fn empty(slots: Vec<Slot>) -> Listed {
        Listed { slots, shift: 32 }
    }

    /// A table with room for `names` tokens, in `slots` (reused storage).
    pub fn with_room(names: usize, mut slots: Vec<Slot>) -> Result<Listed> {
        let len = (2 * names).next_power_of_two().max(16);
        let free = Slot { id: Slot::FREE, bias: 0.0, has_bias: false, banned: false, dry: 0.0 };
        slots.clear();
        alloc::resize(&mut slots, len, free, "the row's listed tokens")?;
        Ok(Listed { slots, shift: 32 - len.trailing_zeros() })
    }

    /// The slot of `id`: its own, or the free one where it goes. The table is never full (twice
    /// as many slots as names), so the probe ends.
    #[inline(always)]
    pub fn find(&self, id: u32) -> usize {
        let mask = self.slots.len() - 1;
        let mut i = (id.wrapping_mul(0x9e37_79b1) >> self.shift) as usize;
        while self.slots[i].id != id && self.slots[i].id != Slot::FREE {
            i = (i + 1) & mask;
        }
        i
    }

    #[inline(always)]
    pub fn entry(&mut self, id: u32) -> &mut Slot {
        let i = self.find(id);
        let s = &mut self.slots[i];
        s.id = id;
        s
    }
}
