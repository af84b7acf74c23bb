//! The noise pool's C functions driven by an arbitrary sequence of operations on up to four
//! pools: make a pool (small random config, sometimes an invalid one), borrow n rows (n = 0,
//! above the capacity, odd lease struct sizes, a NULL out), release a lease (once, twice, to
//! another pool, a forged id, NULL), read a lease, get the stats (odd struct sizes), shut down,
//! free with leases still out, and release those leases after the free.
//!
//! Only calls the header allows are made: nothing on a freed handle but `tokenrace_pool_release`,
//! and that only while a lease of it is still out (the handle lives until the last release).
//! The target keeps a model of each pool (its read position, the wrap, what was handed out) and
//! checks:
//! - every status is documented, never INTERNAL, and the one the header says (INVALID_ARGUMENT
//!   for n = 0 or above the capacity, a bad struct size or a lease not out in this pool; CLOSED
//!   after a shutdown or free; TIMEOUT only under BLOCK; OK otherwise), with `*out` untouched on
//!   failure and a last error naming the function;
//! - a lease's rows, vocab and kind are the pool's, its `first_seq` is exactly the next sequence
//!   number after the wrap rule, and no sequence number is ever handed out twice;
//! - a lease whose slots are still held by an older in-ring lease is a private copy (INLINE) or
//!   times out (BLOCK): the ring never hands out a slot twice at once;
//! - a seeded pool's values are the documented noise of `pool_row_key(seed, seq)`, and every
//!   lease's values stay unchanged and readable until it is released (after a shutdown or
//!   free too);
//! - the stats count exactly the rows borrowed and skipped, and never go down.

#![no_main]

#[path = "../common/mod.rs"]
mod common;

use arbitrary::{Result, Unstructured};
use common::*;
use libfuzzer_sys::fuzz_target;
use std::mem::size_of;
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;
use tokenrace::internals::{pool_row_key, scalar_noise};

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});

struct PoolModel {
    h: *mut tokenrace_pool,
    cap: u64,
    vocab: u64,
    kind: u32,
    block: bool,
    seed: Option<u64>,
    read: u64,
    borrowed: u64,
    skipped: u64,
    freed: bool,
    shut: bool,
    ranges: Vec<(u64, u64)>,
    last: tokenrace_pool_stats,
}

struct LeaseModel {
    pool: usize,
    raw: [u8; 64],
    values: *const f32,
    first_seq: u64,
    rows: u64,
    /// Some(true/false) when the struct size covered `in_ring`.
    in_ring: Option<bool>,
    snapshot: Vec<(usize, u32)>,
    out: bool,
}

struct World {
    pools: Vec<PoolModel>,
    leases: Vec<LeaseModel>,
}

impl World {
    fn outstanding(&self, pool: usize) -> usize {
        self.leases.iter().filter(|l| l.pool == pool && l.out).count()
    }
    /// The handle's memory is still there (not freed, or a lease still holds it).
    fn alive(&self, pool: usize) -> bool {
        !self.pools[pool].freed || self.outstanding(pool) > 0
    }
    /// Slot `s` of `pool` is held by an outstanding lease known to be in the ring (a BLOCK pool
    /// makes no private copies; an INLINE lease whose struct size left out `in_ring` may be one).
    fn slot_held(&self, pool: usize, s: u64) -> bool {
        let cap = self.pools[pool].cap;
        let block = self.pools[pool].block;
        self.leases.iter().any(|l| {
            l.pool == pool && l.out && (l.in_ring == Some(true) || (block && l.in_ring.is_none())) && {
                let p0 = l.first_seq % cap;
                (p0..p0 + l.rows).contains(&s)
            }
        })
    }
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(b[off..off + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(b[off..off + 8].try_into().unwrap())
}

fn expected_value(seed: u64, kind: u32, seq: u64, i: usize) -> f32 {
    let e = scalar_noise::exp(scalar_noise::bits(pool_row_key(seed, seq), i as u32));
    if kind == 0 {
        e
    } else {
        scalar_noise::ln(e)
    }
}

/// The positions of a lease's values that are checked and snapshotted: all of a small lease,
/// a sample of a large one (both ends of every row, and some inside).
fn positions(rows: u64, vocab: u64) -> Vec<usize> {
    let n = (rows * vocab) as usize;
    if n <= 8192 {
        return (0..n).collect();
    }
    let mut p = Vec::new();
    for r in 0..rows as usize {
        let base = r * vocab as usize;
        for i in [0, 1, vocab as usize / 2, vocab as usize - 2, vocab as usize - 1] {
            p.push(base + i);
        }
        let mut x = 12345usize;
        for _ in 0..32 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            p.push(base + (x >> 33) % vocab as usize);
        }
    }
    p
}

fn new_pool(u: &mut Unstructured, w: &mut World) -> Result<()> {
    let mut c = tokenrace_pool_config_default();
    c.rows = u.int_in_range(1..=12)?;
    c.vocab = match u.int_in_range(0..=9u8)? {
        0 => u.int_in_range(250..=260)?,
        1 if one_in(u, 4)? => u.int_in_range(16_380..=16_390)?, // around the producers' chunk
        _ => u.int_in_range(1..=40)?,
    };
    c.kind = u.int_in_range(0..=1)?;
    c.threads = u.int_in_range(1..=3)?;
    c.has_seed = !one_in(u, 6)? as u32;
    c.seed = u.arbitrary()?;
    c.policy = u.int_in_range(0..=1)?;
    c.timeout_ms = u.int_in_range(0..=2)?;
    let mut expect = OK;
    if one_in(u, 12)? {
        match u.int_in_range(0..=4u8)? {
            0 => c.rows = 0,
            1 => c.vocab = 0,
            2 => c.threads = 0,
            3 => c.kind = 2,
            _ => c.timeout_ms = 3_600_001,
        }
        expect = INVALID_CONFIG;
    }
    let sentinel = std::ptr::NonNull::<tokenrace_pool>::dangling().as_ptr();
    let mut h = sentinel;
    // SAFETY: a valid config struct, a writable out.
    let st = code(unsafe { tokenrace_pool_new(&c, &mut h) }, "tokenrace_pool_new");
    let err = check_last_error(st, "tokenrace_pool_new");
    assert_eq!(st, expect, "tokenrace_pool_new: {err}");
    if st != OK {
        assert_eq!(h, sentinel, "tokenrace_pool_new failed but wrote *out");
        return Ok(());
    }
    w.pools.push(PoolModel {
        h,
        cap: c.rows as u64,
        vocab: c.vocab as u64,
        kind: c.kind,
        block: c.policy == 1,
        seed: (c.has_seed != 0).then_some(c.seed),
        read: 0,
        borrowed: 0,
        skipped: 0,
        freed: false,
        shut: false,
        ranges: Vec::new(),
        last: tokenrace_pool_stats::default(),
    });
    Ok(())
}

fn borrow(u: &mut Unstructured, w: &mut World) -> Result<()> {
    let i = u.choose_index(w.pools.len())?;
    if w.pools[i].freed {
        return Ok(()); // no call may use a freed handle
    }
    let cap = w.pools[i].cap;
    let n: u32 = match u.int_in_range(0..=9u8)? {
        0 => 0,
        1 => cap as u32 + 1,
        2 => u32::MAX,
        3 => cap as u32,
        _ => u.int_in_range(1..=cap as u32)?,
    };
    let size: Option<u32> = match u.int_in_range(0..=15u8)? {
        0 => None,
        1 => Some(40),
        2 => Some(44),
        3 => Some(u.int_in_range(0..=64)?),
        4 => Some(56),
        _ => Some(48),
    };
    let size_ok = size.is_some_and(|s| s == 40 || s == 44 || s >= 48);
    let mut raw = [0xcdu8; 64];
    if let Some(s) = size {
        raw[..4].copy_from_slice(&s.to_ne_bytes());
    }
    let before = raw;
    let null_pool = one_in(u, 40)?;
    let pool_ptr = if null_pool { std::ptr::null_mut() } else { w.pools[i].h };
    let out = if size.is_some() { raw.as_mut_ptr() as *mut tokenrace_pool_lease } else { std::ptr::null_mut() };

    // What the model says, before the call.
    let p = &w.pools[i];
    let valid_n = n >= 1 && n as u64 <= cap;
    let mut start = p.read;
    let mut skip = 0;
    if (start % cap) + n as u64 > cap {
        skip = cap - start % cap;
        start += skip;
    }
    let held = valid_n && (0..n as u64).any(|k| w.slot_held(i, (start + k) % cap));
    let expect: &[u32] = if null_pool || !size_ok || !valid_n {
        &[INVALID_ARGUMENT]
    } else if p.shut {
        &[CLOSED]
    } else if p.block && held {
        &[TIMEOUT]
    } else if p.block {
        &[OK, TIMEOUT]
    } else {
        &[OK]
    };
    // SAFETY: a live pool (or NULL); 64 writable bytes, at least struct_size.
    let st = code(unsafe { tokenrace_pool_borrow(pool_ptr, n, out) }, "tokenrace_pool_borrow");
    let err = check_last_error(st, "tokenrace_pool_borrow");
    if verbose() {
        eprintln!("borrow: {} n {n} cap {cap} block {} held {held}", status_name(st), w.pools[i].block);
    }
    assert!(
        expect.contains(&st),
        "tokenrace_pool_borrow(n {n}, size {size:?}, cap {cap}, held {held}): {} ({err}), want {expect:?}",
        status_name(st)
    );
    let p = &mut w.pools[i];
    if st == OK || st == TIMEOUT {
        // The borrow took its sequence numbers (a timed-out one skips them).
        p.read = start + n as u64;
        p.skipped += skip;
    }
    if st != OK {
        if st == TIMEOUT {
            p.skipped += n as u64;
        }
        assert!(raw == before, "tokenrace_pool_borrow failed but wrote *out");
        return Ok(());
    }
    let s = size.unwrap() as usize;
    let written = s.min(size_of::<tokenrace_pool_lease>());
    assert_eq!(u32_at(&raw, 0) as usize, written, "lease.struct_size");
    assert!(raw[written..] == before[written..], "tokenrace_pool_borrow wrote past struct_size {s}");
    let kind = u32_at(&raw, 4);
    let values = u64_at(&raw, 8) as usize as *const f32;
    let (rows, vocab) = (u32_at(&raw, 16) as u64, u32_at(&raw, 20) as u64);
    let first_seq = u64_at(&raw, 32);
    let in_ring = (written >= 44).then(|| u32_at(&raw, 40));
    assert_eq!((kind, rows, vocab), (p.kind, n as u64, p.vocab), "lease kind/rows/vocab");
    assert_eq!(first_seq, start, "lease.first_seq (read {}, n {n}, cap {cap})", start - skip);
    let end = first_seq + rows;
    assert!(
        p.ranges.iter().all(|&(a, b)| end <= a || b <= first_seq),
        "sequence numbers {first_seq}..{end} handed out twice ({:?})",
        p.ranges
    );
    p.ranges.push((first_seq, end));
    p.borrowed += rows;
    if let Some(r) = in_ring {
        assert!(r <= 1, "lease.in_ring {r}");
        if held {
            assert_eq!(r, 0, "an INLINE lease in the ring over slots an older lease still holds");
        }
    }
    assert!(!values.is_null() && values.is_aligned(), "lease.values {values:?}");
    // Read every checked value: valid noise, and the documented values of a seeded pool.
    let mut snapshot = Vec::new();
    for at in positions(rows, vocab) {
        // SAFETY: the lease's rows x vocab values are readable until it is released.
        let x = unsafe { values.add(at).read() };
        if kind == 0 {
            assert!(x.is_finite() && x > 0.0, "E = {x}");
        } else {
            assert!(x.is_finite(), "ln E = {x}");
        }
        if let Some(seed) = p.seed {
            let (r, t) = (at as u64 / vocab, at as u64 % vocab);
            let want = expected_value(seed, kind, first_seq + r, t as usize);
            assert_eq!(x.to_bits(), want.to_bits(), "row seq {} token {t}: {x}, want {want}", first_seq + r);
        }
        snapshot.push((at, x.to_bits()));
    }
    w.leases.push(LeaseModel {
        pool: i,
        raw,
        values,
        first_seq,
        rows,
        in_ring: in_ring.map(|r| r == 1),
        snapshot,
        out: true,
    });
    Ok(())
}

fn verify(l: &LeaseModel) {
    for &(at, bits) in &l.snapshot {
        // SAFETY: the lease is still out: its values are readable.
        let x = unsafe { l.values.add(at).read() };
        assert_eq!(x.to_bits(), bits, "lease seq {} value {at} changed while leased", l.first_seq);
    }
}

fn release(u: &mut Unstructured, w: &mut World) -> Result<()> {
    if w.leases.is_empty() {
        return Ok(());
    }
    let j = u.choose_index(w.leases.len())?;
    let own = w.leases[j].pool;
    // Which pool it goes to, and what it carries.
    let target = if one_in(u, 5)? { u.choose_index(w.pools.len())? } else { own };
    if !w.alive(target) {
        return Ok(());
    }
    let mut raw = w.leases[j].raw;
    let how = u.int_in_range(0..=19u8)?;
    let forged = how == 0;
    if forged {
        let id: u64 = if u.arbitrary()? { u.int_in_range(0..=64)? } else { u.arbitrary()? };
        raw[24..32].copy_from_slice(&id.to_ne_bytes());
    }
    let null_lease = how == 1;
    let null_pool = how == 2;
    let id = u64_at(&raw, 24);
    // The lease the id names, if it is out in the target pool.
    let hit = w.leases.iter().position(|l| l.pool == target && l.out && u64_at(&l.raw, 24) == id);
    let expect = if null_lease || null_pool || hit.is_none() { INVALID_ARGUMENT } else { OK };
    if let Some(k) = hit {
        if !null_lease && !null_pool {
            verify(&w.leases[k]);
        }
    }
    let lp = if null_lease { std::ptr::null() } else { raw.as_ptr() as *const tokenrace_pool_lease };
    let pp = if null_pool { std::ptr::null_mut() } else { w.pools[target].h };
    // SAFETY: a live handle (or NULL); a lease struct (or NULL).
    let st = code(unsafe { tokenrace_pool_release(pp, lp) }, "tokenrace_pool_release");
    let err = check_last_error(st, "tokenrace_pool_release");
    assert_eq!(st, expect, "tokenrace_pool_release (forged {forged}, to own {}): {err}", target == own);
    if st == OK {
        w.leases[hit.unwrap()].out = false;
    }
    Ok(())
}

fn stats(u: &mut Unstructured, w: &mut World) -> Result<()> {
    let i = u.choose_index(w.pools.len())?;
    if w.pools[i].freed {
        return Ok(());
    }
    let size: u32 = match u.int_in_range(0..=7u8)? {
        0 => 8,
        1 => 16,
        2 => 12, // inside rows_produced
        3 => 4,  // below V1
        4 => 64,
        5 => u.int_in_range(0..=64)?,
        _ => 56,
    };
    let full = size_of::<tokenrace_pool_stats>();
    let ok = size >= 8 && (size as usize >= full || size.is_multiple_of(8));
    let mut raw = [0xeeu8; 64];
    raw[..4].copy_from_slice(&size.to_ne_bytes());
    let before = raw;
    // SAFETY: a live pool; 64 writable bytes, at least struct_size.
    let st = code(
        unsafe { tokenrace_pool_get_stats(w.pools[i].h, raw.as_mut_ptr() as *mut tokenrace_pool_stats) },
        "tokenrace_pool_get_stats",
    );
    let err = check_last_error(st, "tokenrace_pool_get_stats");
    assert_eq!(st, if ok { OK } else { INVALID_ARGUMENT }, "tokenrace_pool_get_stats(size {size}): {err}");
    if st != OK {
        assert!(raw == before, "tokenrace_pool_get_stats failed but wrote *out");
        return Ok(());
    }
    let n = (size as usize).min(full);
    assert!(raw[n..] == before[n..], "tokenrace_pool_get_stats wrote past struct_size");
    assert_eq!(u32_at(&raw, 0) as usize, n);
    let p = &mut w.pools[i];
    let field = |k: usize| (8 + 8 * k + 8 <= n).then(|| u64_at(&raw, 8 + 8 * k));
    let last = [
        p.last.rows_produced,
        p.last.rows_borrowed,
        p.last.borrows_waited,
        p.last.wait_ns,
        p.last.inline_rows,
        p.last.rows_skipped,
    ];
    for (k, &prev) in last.iter().enumerate() {
        if let Some(v) = field(k) {
            assert!(v >= prev, "stats field {k} went down: {prev} -> {v}");
        }
    }
    if let Some(b) = field(1) {
        assert_eq!(b, p.borrowed, "rows_borrowed");
        p.last.rows_borrowed = b;
    }
    if let Some(s) = field(5) {
        assert_eq!(s, p.skipped, "rows_skipped");
        p.last.rows_skipped = s;
    }
    if let Some(x) = field(4) {
        assert!(x <= p.borrowed, "inline_rows {x} above rows_borrowed {}", p.borrowed);
        p.last.inline_rows = x;
    }
    if let Some(x) = field(0) {
        p.last.rows_produced = x;
    }
    if let Some(x) = field(2) {
        p.last.borrows_waited = x;
    }
    if let Some(x) = field(3) {
        p.last.wait_ns = x;
    }
    Ok(())
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let u = &mut u;
    let mut w = World { pools: Vec::new(), leases: Vec::new() };
    let mut ops = 0;
    while !u.is_empty() && ops < 48 {
        ops += 1;
        let op = u.int_in_range(0..=15u8)?;
        if w.pools.is_empty() || (op == 0 && w.pools.len() < 4) {
            new_pool(u, &mut w)?;
            continue;
        }
        match op {
            1..=5 => borrow(u, &mut w)?,
            6..=8 => release(u, &mut w)?,
            9 => stats(u, &mut w)?,
            10 => {
                let i = u.choose_index(w.pools.len())?;
                if !w.pools[i].freed {
                    // SAFETY: a live pool.
                    let st = code(unsafe { tokenrace_pool_shutdown(w.pools[i].h) }, "tokenrace_pool_shutdown");
                    check_last_error(st, "tokenrace_pool_shutdown");
                    assert_eq!(st, OK, "tokenrace_pool_shutdown: {}", last_error());
                    w.pools[i].shut = true;
                }
            }
            11 => {
                let i = u.choose_index(w.pools.len())?;
                if !w.pools[i].freed {
                    // SAFETY: a live pool, not used again but by releases of its leases.
                    unsafe { tokenrace_pool_free(w.pools[i].h) };
                    w.pools[i].freed = true;
                    w.pools[i].shut = true;
                }
            }
            12 => {
                // NULL handles.
                // SAFETY: NULL is allowed and refused.
                unsafe {
                    assert_eq!(
                        code(tokenrace_pool_shutdown(std::ptr::null_mut()), "tokenrace_pool_shutdown"),
                        INVALID_ARGUMENT
                    );
                    check_last_error(INVALID_ARGUMENT, "tokenrace_pool_shutdown");
                    let mut s = tokenrace_pool_stats { struct_size: 56, ..Default::default() };
                    assert_eq!(
                        code(tokenrace_pool_get_stats(std::ptr::null(), &mut s), "tokenrace_pool_get_stats"),
                        INVALID_ARGUMENT
                    );
                    check_last_error(INVALID_ARGUMENT, "tokenrace_pool_get_stats");
                    tokenrace_pool_free(std::ptr::null_mut());
                }
            }
            13 => {
                if !w.leases.is_empty() {
                    let j = u.choose_index(w.leases.len())?;
                    if w.leases[j].out {
                        verify(&w.leases[j]);
                    }
                }
            }
            14 => std::thread::yield_now(),
            _ => borrow(u, &mut w)?,
        }
    }
    // Give back every lease (each still unchanged), then free every pool.
    for j in 0..w.leases.len() {
        if w.leases[j].out {
            verify(&w.leases[j]);
            let p = w.pools[w.leases[j].pool].h;
            // SAFETY: the lease is out, so its handle lives.
            let st = code(
                unsafe { tokenrace_pool_release(p, w.leases[j].raw.as_ptr() as *const tokenrace_pool_lease) },
                "tokenrace_pool_release",
            );
            assert_eq!(st, OK, "the final release: {}", last_error());
            w.leases[j].out = false;
        }
    }
    for p in &w.pools {
        if !p.freed {
            // SAFETY: a live pool, freed once.
            unsafe { tokenrace_pool_free(p.h) };
        }
    }
    Ok(())
}
