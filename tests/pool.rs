//! The noise pool: no reuse, zero copy, reproducibility, its noise, the drain policies,
//! shutdown, fork, the sampler hook and the C functions.
mod common;

use common::*;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokenrace::internals::pool_api::*;
use tokenrace::internals::scalar_noise;
use tokenrace::internals::types::*;
use tokenrace::internals::{pool_row_key, Generator, Pool, PoolOptions};
use tokenrace::*;

fn pcfg(rows: usize, vocab: usize, policy: DrainPolicy, timeout_ms: u64) -> PoolConfig {
    PoolConfig { rows, vocab, policy, timeout_ms, seed: Some(42), ..PoolConfig::default() }
}

fn counting(cfg: PoolConfig, producers: usize) -> Pool {
    Pool::with_options(cfg, PoolOptions { generator: Generator::Counting, producers: Some(producers), level: None })
        .unwrap()
}

#[test]
fn no_sequence_number_is_handed_out_twice() {
    for producers in [1usize, 4] {
        for policy in [DrainPolicy::Block, DrainPolicy::Inline] {
            let pool = Arc::new(counting(pcfg(16, 8, policy, 20_000), producers));
            let handles: Vec<_> = (0..4u64)
                .map(|t| {
                    let pool = pool.clone();
                    std::thread::spawn(move || {
                        let mut rng = TestRng::new(t);
                        let mut seen = Vec::new();
                        for i in 0..1500 {
                            let n = 1 + rng.below(6);
                            let lease = pool.borrow(n).unwrap();
                            assert_eq!(lease.rows(), n);
                            for r in 0..n {
                                let s = lease.first_seq() + r as u64;
                                assert!(lease.row(r).iter().all(|v| v.to_bits() as u64 == s), "row {r} of a lease");
                                seen.push(s);
                            }
                            if i % 7 == 0 {
                                std::thread::yield_now();
                            }
                        }
                        seen
                    })
                })
                .collect();
            let all: Vec<u64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
            let unique: HashSet<u64> = all.iter().copied().collect();
            assert_eq!(unique.len(), all.len(), "{producers} producers, {policy:?}: a sequence number came out twice");
            let st = pool.stats();
            assert_eq!(st.rows_borrowed, all.len() as u64);
            assert!(all.iter().max().unwrap() / 16 > 100, "too few wraps");
            if policy == DrainPolicy::Block {
                assert_eq!(st.inline_rows, 0);
                assert!(st.rows_produced >= st.rows_borrowed);
            }
        }
    }
}

#[test]
fn borrows_are_zero_copy_views_of_the_buffer() {
    let pool = Pool::new(pcfg(8, 100, DrainPolicy::Block, 10_000)).unwrap();
    for n in [3, 3, 5, 1, 8] {
        let lease = pool.borrow(n).unwrap();
        assert_eq!(lease.values().len(), n * 100);
        assert!(pool.holds(lease.values()), "the lease is not inside the pool's buffer");
    }
}

fn run_sizes(cfg: PoolConfig, producers: usize, sizes: &[usize]) -> Vec<u32> {
    let pool = Pool::with_options(cfg, PoolOptions { producers: Some(producers), ..PoolOptions::default() }).unwrap();
    let mut out = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let lease = pool.borrow(n).unwrap();
        out.extend(lease.values().iter().map(|v| v.to_bits()));
        if i % 5 == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

#[test]
fn a_seeded_pool_is_a_function_of_seed_and_borrow_sizes() {
    let mut rng = TestRng::new(5);
    let sizes: Vec<usize> = (0..200).map(|_| 1 + rng.below(7)).collect();
    let reference = run_sizes(pcfg(10, 300, DrainPolicy::Block, 10_000), 1, &sizes);
    for (policy, producers) in
        [(DrainPolicy::Block, 4), (DrainPolicy::Inline, 1), (DrainPolicy::Inline, 4), (DrainPolicy::Inline, 0)]
    {
        let got = run_sizes(pcfg(10, 300, policy, 10_000), producers, &sizes);
        assert!(got == reference, "{policy:?} with {producers} producers differs");
    }
    let other = run_sizes(PoolConfig { seed: Some(43), ..pcfg(10, 300, DrainPolicy::Block, 10_000) }, 1, &sizes);
    assert!(other != reference, "the seed does not matter");
}

#[test]
fn pool_values_are_the_noise_of_the_documented_key() {
    for kind in [NoiseKind::Exp, NoiseKind::LogExp] {
        let pool = Pool::new(PoolConfig { kind, ..pcfg(6, 1000, DrainPolicy::Inline, 1000) }).unwrap();
        for n in [2, 3, 4] {
            let lease = pool.borrow(n).unwrap();
            assert_eq!(lease.kind(), kind);
            for r in 0..n {
                let key = pool_row_key(42, lease.first_seq() + r as u64);
                for (i, &v) in lease.row(r).iter().enumerate() {
                    let e = scalar_noise::exp(scalar_noise::bits(key, i as u32));
                    let want = if kind == NoiseKind::Exp { e } else { scalar_noise::ln(e) };
                    assert_eq!(v.to_bits(), want.to_bits(), "{kind:?} row {r} token {i}: {v} != {want}");
                    if kind == NoiseKind::Exp {
                        assert!(v > 0.0 && v.is_finite());
                    }
                }
            }
        }
    }
}

fn pool_frequencies(s: &Sampler, x: &[f32], t: f32, n: usize, per_call: usize) -> Vec<u64> {
    let vocab = x.len();
    let rows: Vec<f32> = (0..per_call).flat_map(|_| x.iter().copied()).collect();
    let temps = vec![t; per_call];
    let mut counts = vec![0u64; vocab];
    for _ in 0..n / per_call {
        let b = Batch { temperature: Some(&temps), ..Batch::new(Logits::F32(&rows), per_call, vocab) };
        for v in draw(s, &b).0 {
            counts[v as usize] += 1;
        }
    }
    counts
}

#[test]
fn draws_with_pool_noise_match_softmax_by_chi_square() {
    let x: Vec<f32> = vec![1.0, f32::NEG_INFINITY, 0.5, 2.0, -1.0, 2.0, f32::NEG_INFINITY, 0.0, -3.0, 1.5, 3.0, -0.5];
    let vocab = x.len();
    let own = Sampler::new(Config {
        noise: NoiseSource::Pool,
        vocab_size: vocab,
        max_rows: 1000,
        seed: Some(9),
        ..Config::default()
    })
    .unwrap();
    // An attached pool of E (the sampler's own holds ln E).
    let auto = Sampler::new(Config { vocab_size: vocab, max_rows: 1000, seed: Some(9), ..Config::default() }).unwrap();
    let exp_pool = Arc::new(
        Pool::new(PoolConfig { kind: NoiseKind::Exp, ..pcfg(2000, vocab, DrainPolicy::Inline, 1000) }).unwrap(),
    );
    auto.attach_pool(exp_pool.clone()).unwrap();
    let n = 100_000;
    for (name, s) in [("own ln E pool", &own), ("attached E pool", &auto)] {
        for &t in &[0.5f32, 1.0, 2.0] {
            let counts = pool_frequencies(s, &x, t, n, 1000);
            let (stat, dof) = chi2(&counts, &softmax64(&x, t as f64));
            let crit = chi2_critical(dof, 5.0);
            assert!(stat < crit, "{name} T {t}: chi-square {stat} >= {crit} on {dof} dof");
            let (wrong, _) = chi2(&counts, &softmax64(&x, t as f64 * 1.05));
            assert!(wrong > crit, "{name} T {t}: the test cannot tell T from 1.05 T ({wrong} < {crit})");
        }
        let st = s.stats();
        assert_eq!((st.pool_rows, st.inline_rows), (3 * n as u64, 0), "{name}");
    }
    assert_eq!(exp_pool.stats().rows_borrowed, 3 * n as u64);
}

#[test]
fn only_unseeded_sampling_rows_take_pool_noise() {
    let vocab = 50;
    let s =
        Sampler::new(Config { noise: NoiseSource::Pool, vocab_size: vocab, max_rows: 8, ..Config::default() }).unwrap();
    let pool = s.pool().unwrap();
    let mut rng = TestRng::new(3);
    let x: Vec<f32> = (0..8 * vocab).map(|_| rng.normal() as f32).collect();
    let temps = [1.0f32, 0.0, 1.0, 0.7, 0.0, 1.0, 2.0, 1.0];
    let seeds = [0u64, 0, 5, 0, 0, 6, 0, 0];
    let seeded = [0u8, 0, 1, 0, 0, 1, 0, 0];
    let b = Batch {
        temperature: Some(&temps),
        seeds: Some(&seeds),
        seeded: Some(&seeded),
        ..Batch::new(Logits::F32(&x), 8, vocab)
    };
    draw(&s, &b);
    // 8 rows: 2 greedy, 2 seeded, 4 from the pool.
    assert_eq!(pool.stats().rows_borrowed, 4);
    let st = s.stats();
    assert_eq!((st.pool_rows, st.greedy_rows, st.seeded_rows, st.inline_rows), (4, 2, 2, 0));
    // Caller-supplied noise takes none either.
    let noise = vec![1.0f32; 8 * vocab];
    let b = Batch { noise: Some(ExternalNoise { values: &noise, kind: NoiseKind::Exp, row_stride: vocab }), ..b };
    draw(&s, &b);
    assert_eq!(pool.stats().rows_borrowed, 4);
    // Every lease was released: the pool can hand out its whole capacity.
    drop(pool.borrow(pool.config().rows).unwrap());
}

#[test]
fn pool_settings_are_checked() {
    let err = Sampler::new(Config { noise: NoiseSource::Pool, ..Config::default() }).err().unwrap();
    assert_eq!(err.kind, ErrorKind::InvalidConfig);
    assert!(err.message.contains("vocab_size"), "{}", err.message);
    let err = Sampler::new(Config {
        noise: NoiseSource::Pool,
        vocab_size: 10,
        max_rows: 8,
        pool_rows: 4,
        ..Config::default()
    })
    .err()
    .unwrap();
    assert!(err.message.contains("pool_rows"), "{}", err.message);
    let pool = Arc::new(Pool::new(pcfg(4, 10, DrainPolicy::Inline, 0)).unwrap());
    let err = pool.borrow(5).err().unwrap();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("n_rows: 5"), "{}", err.message);
    assert_eq!(pool.borrow(0).err().unwrap().kind, ErrorKind::InvalidArgument);
    let s = Sampler::new(Config { vocab_size: 11, ..Config::default() }).unwrap();
    assert!(s.attach_pool(pool.clone()).unwrap_err().message.contains("vocab"));
    let s = Sampler::new(Config { vocab_size: 10, noise: NoiseSource::Inline, ..Config::default() }).unwrap();
    assert!(s.attach_pool(pool).is_err());
}

#[test]
fn block_times_out_and_inline_falls_back() {
    // BLOCK: the only producer cannot refill a slot that is still leased.
    let pool = Pool::new(pcfg(4, 64, DrainPolicy::Block, 150)).unwrap();
    let held = pool.borrow(4).unwrap();
    let t0 = Instant::now();
    let err = pool.borrow(1).err().unwrap();
    let waited = t0.elapsed();
    assert_eq!(err.kind, ErrorKind::Timeout);
    assert!(err.message.contains("150 ms"), "{}", err.message);
    assert!(waited >= Duration::from_millis(140) && waited < Duration::from_secs(3), "waited {waited:?}");
    let st = pool.stats();
    assert!(st.borrows_waited >= 1 && st.wait_ns >= 140_000_000, "{st:?}");
    drop(held);
    pool.borrow(2).unwrap(); // it recovers once the lease is back

    // INLINE with no producer: every row is generated by the borrower, and counted.
    let opts = PoolOptions { producers: Some(0), ..PoolOptions::default() };
    let pool = Pool::with_options(pcfg(4, 64, DrainPolicy::Inline, 0), opts).unwrap();
    let a = pool.borrow(3).unwrap();
    assert_eq!(pool.stats().inline_rows, 3);
    // The next rows' slots are still leased by `a`: generated off the buffer, still counted.
    let b = pool.borrow(2).unwrap();
    assert_eq!(pool.stats().inline_rows, 5);
    assert_eq!(b.first_seq(), 4);
    drop((a, b));
}

#[test]
fn shutdown_wakes_a_blocked_borrower() {
    let pool = Arc::new(Pool::new(pcfg(2, 64, DrainPolicy::Block, 60_000)).unwrap());
    let held = pool.borrow(2).unwrap();
    let p = pool.clone();
    let waiter = std::thread::spawn(move || p.borrow(1).err().map(|e| e.kind));
    std::thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    pool.shutdown();
    assert_eq!(waiter.join().unwrap(), Some(ErrorKind::Closed));
    assert!(t0.elapsed() < Duration::from_secs(2));
    assert_eq!(pool.borrow(1).err().unwrap().kind, ErrorKind::Closed);
    assert!(held.values().iter().all(|v| v.is_finite())); // a lease outlives the shutdown
}

#[test]
fn drop_stops_producers_mid_fill() {
    // Large rows: the producers are busy filling when the pool is dropped.
    let pool = Pool::new(PoolConfig { threads: 2, ..pcfg(8, 4 << 20, DrainPolicy::Inline, 0) }).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    let t0 = Instant::now();
    drop(pool);
    assert!(t0.elapsed() < Duration::from_millis(500), "drop took {:?}", t0.elapsed());
}

#[test]
fn a_fork_child_gets_closed_not_a_deadlock() {
    let pool = Pool::new(pcfg(4, 256, DrainPolicy::Block, 5_000)).unwrap();
    drop(pool.borrow(2).unwrap());
    // SAFETY: the child only calls borrow (which checks the pid before taking any lock) and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        unsafe { libc::alarm(10) }; // a hang in the child ends it with SIGALRM
        let code = match pool.borrow(1) {
            Err(e) if e.kind == ErrorKind::Closed && e.message.contains("fork") => 0,
            _ => 1,
        };
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "the child did not exit normally (status {status})");
    assert_eq!(libc::WEXITSTATUS(status), 0, "the child's borrow did not fail with Closed");
    pool.borrow(1).unwrap(); // the parent's pool is unaffected
}

fn lease_slot() -> tokenrace_pool_lease {
    tokenrace_pool_lease {
        struct_size: std::mem::size_of::<tokenrace_pool_lease>() as u32,
        kind: 0,
        values: std::ptr::null(),
        rows: 0,
        vocab: 0,
        id: 0,
        first_seq: 0,
        in_ring: 0,
        reserved0: 0,
    }
}

#[test]
fn the_c_functions_work_and_free_with_a_lease_out_is_defined() {
    unsafe {
        let mut cfg = tokenrace_pool_config_default();
        assert_eq!(cfg.struct_size as usize, std::mem::size_of::<tokenrace_pool_config>());
        assert_eq!((cfg.rows, cfg.vocab, cfg.threads, cfg.timeout_ms), (1024, 0, 1, 1000));
        let mut pool: *mut tokenrace_pool = std::ptr::null_mut();
        assert_eq!(tokenrace_pool_new(&cfg, &mut pool), tokenrace_status::InvalidConfig);
        let msg =
            std::ffi::CStr::from_ptr(tokenrace::internals::api::tokenrace_last_error()).to_string_lossy().into_owned();
        assert!(msg.contains("vocab"), "{msg}");
        let mut env_cfg = cfg;
        assert_eq!(tokenrace_pool_config_from_env(&mut env_cfg), tokenrace_status::Ok);

        cfg.rows = 3;
        cfg.vocab = 32;
        cfg.kind = tokenrace_noise_kind::Exp as u32;
        cfg.policy = tokenrace_pool_policy::Block as u32;
        cfg.timeout_ms = 60_000;
        cfg.has_seed = 1;
        cfg.seed = 7;
        assert_eq!(tokenrace_pool_new(&cfg, &mut pool), tokenrace_status::Ok);
        let (mut a, mut b) = (lease_slot(), lease_slot());
        assert_eq!(tokenrace_pool_borrow(pool, 2, &mut a), tokenrace_status::Ok);
        assert_eq!((a.rows, a.vocab, a.kind, a.first_seq), (2, 32, 0, 0));
        let vals = std::slice::from_raw_parts(a.values, 64);
        let want = scalar_noise::exp(scalar_noise::bits(pool_row_key(7, 1), 5));
        assert_eq!(vals[32 + 5], want);
        assert_eq!(tokenrace_pool_borrow(pool, 4, &mut b), tokenrace_status::InvalidArgument);
        assert_eq!(tokenrace_pool_borrow(pool, 1, &mut b), tokenrace_status::Ok);
        assert_eq!(tokenrace_pool_release(pool, &b), tokenrace_status::Ok);
        assert_eq!(tokenrace_pool_release(pool, &b), tokenrace_status::InvalidArgument);

        let mut st = tokenrace_pool_stats {
            struct_size: std::mem::size_of::<tokenrace_pool_stats>() as u32,
            ..Default::default()
        };
        assert_eq!(tokenrace_pool_get_stats(pool, &mut st), tokenrace_status::Ok);
        assert_eq!(st.rows_borrowed, 3);

        // A sampler keeps an attached pool running; vocab must match.
        let mut scfg = tokenrace::internals::api::tokenrace_config_default();
        scfg.vocab_size = 32;
        let mut sampler: *mut tokenrace::internals::api::tokenrace_sampler = std::ptr::null_mut();
        assert_eq!(tokenrace::internals::api::tokenrace_sampler_new(&scfg, &mut sampler), tokenrace_status::Ok);
        assert_eq!(tokenrace_sampler_attach_pool(sampler, pool), tokenrace_status::Ok);
        tokenrace::internals::api::tokenrace_sampler_free(sampler);

        // A borrower blocked in BLOCK (slot 0 is still leased by `a`) is woken by free: CLOSED.
        let addr = pool as usize;
        let waiter = std::thread::spawn(move || {
            let mut c = lease_slot();
            tokenrace_pool_borrow(addr as *mut tokenrace_pool, 1, &mut c)
        });
        std::thread::sleep(Duration::from_millis(100));
        let t0 = Instant::now();
        tokenrace_pool_free(pool);
        assert_eq!(waiter.join().unwrap(), tokenrace_status::Closed);
        assert!(t0.elapsed() < Duration::from_secs(2));
        // The lease still out stays readable and is released after free (the last reference).
        assert_eq!(vals[32 + 5], want);
        assert_eq!(tokenrace_pool_release(pool, &a), tokenrace_status::Ok);
    }
}

/// A lease given back to a pool it did not come from is refused (lease ids are unique across
/// pools), and the lease stays out on its own pool until given back there.
#[test]
fn a_lease_of_another_pool_is_refused() {
    unsafe {
        let mut cfg = tokenrace_pool_config_default();
        cfg.rows = 4;
        cfg.vocab = 16;
        let (mut a, mut b): (*mut tokenrace_pool, *mut tokenrace_pool) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(tokenrace_pool_new(&cfg, &mut a), tokenrace_status::Ok);
        assert_eq!(tokenrace_pool_new(&cfg, &mut b), tokenrace_status::Ok);
        let (mut la, mut lb) = (lease_slot(), lease_slot());
        assert_eq!(tokenrace_pool_borrow(a, 1, &mut la), tokenrace_status::Ok);
        assert_eq!(tokenrace_pool_borrow(b, 1, &mut lb), tokenrace_status::Ok);
        assert_ne!(la.id, lb.id, "lease ids are unique across pools");
        assert_eq!(tokenrace_pool_release(b, &la), tokenrace_status::InvalidArgument);
        let msg =
            std::ffi::CStr::from_ptr(tokenrace::internals::api::tokenrace_last_error()).to_string_lossy().into_owned();
        assert!(msg.contains("not a lease of this pool"), "{msg}");
        assert_eq!(tokenrace_pool_release(a, &la), tokenrace_status::Ok);
        assert_eq!(tokenrace_pool_release(b, &lb), tokenrace_status::Ok);
        tokenrace_pool_free(a);
        tokenrace_pool_free(b);
    }
}

/// Tokens drawn from pool rows `0..n` of a pool seeded with `pool_seed` (as external ln-E noise)
/// and from requests seeded with `request_seed` at offsets `0..n`, on the row `x` at T = 1: how
/// many rows agree, and how many would with the pool keys of the xored domain,
/// `seeded_row_key(pool_seed ^ POOL_KEY_DOMAIN, q)` (their race computed here, in float64).
fn agreement_with_requests(x: &[f32], pool_seed: u64, request_seed: u64, n: usize) -> (usize, usize) {
    let (vocab, rows) = (x.len(), 1000);
    let pool = Pool::new(PoolConfig {
        kind: NoiseKind::LogExp,
        seed: Some(pool_seed),
        ..pcfg(rows, vocab, DrainPolicy::Inline, 10_000)
    })
    .unwrap();
    let s = sampler(best_level(), 1);
    let logits: Vec<f32> = (0..rows).flat_map(|_| x.iter().copied()).collect();
    let temps = vec![1.0f32; rows];
    let (mut agree, mut agree_xored) = (0, 0);
    for _ in 0..n / rows {
        let lease = pool.borrow(rows).unwrap();
        let first = lease.first_seq();
        for r in [0, rows - 1] {
            let seq = first + r as u64;
            assert_eq!(
                pool_row_key(pool_seed, seq),
                common::reference::pool_key(pool_seed, seq),
                "the documented pool key"
            );
        }
        let b = Batch {
            noise: Some(ExternalNoise { values: lease.values(), kind: NoiseKind::LogExp, row_stride: vocab }),
            ..Batch { temperature: Some(&temps), ..Batch::new(Logits::F32(&logits), rows, vocab) }
        };
        let from_pool = draw(&s, &b).0;
        let seeds = vec![request_seed; rows];
        let offsets: Vec<u64> = (0..rows as u64).map(|r| first + r).collect();
        let b = Batch {
            seeds: Some(&seeds),
            offsets: Some(&offsets),
            ..Batch { temperature: Some(&temps), ..Batch::new(Logits::F32(&logits), rows, vocab) }
        };
        let requested = draw(&s, &b).0;
        agree += from_pool.iter().zip(&requested).filter(|(a, b)| a == b).count();
        for (r, &tok) in requested.iter().enumerate() {
            let key = tokenrace::internals::seeded_row_key(pool_seed ^ 0x706f_6f6c_6e6f_6973, first + r as u64);
            let keys =
                (0..vocab).map(|i| x[i] as f64 - (scalar_noise::exp(scalar_noise::bits(key, i as u32)) as f64).ln());
            let best = keys.enumerate().fold((0, f64::NEG_INFINITY), |b, (i, k)| if k > b.1 { (i, k) } else { b });
            agree_xored += (best.0 == tok as usize) as usize;
        }
    }
    (agree, agree_xored)
}

/// With the pool's domain an xor on the seed, the request seeded with `s ^ 0x706f6f6c6e6f6973`
/// at offset q had the key of row q of the pool seeded with s: its tokens' own noise was the
/// pool row's (plus the block minimum), and on 512 N(0, 1) logits it drew the same token in
/// about 25% of rows (computed below) where independent draws agree in `sum p^2` = 0.54%. Neither it,
/// nor the request of the pool's own seed, may agree more often than chance.
#[test]
fn pool_rows_share_no_noise_with_seeded_requests() {
    let mut rng = TestRng::new(12);
    let x: Vec<f32> = (0..512).map(|_| rng.normal() as f32).collect();
    let chance: f64 = softmax64(&x, 1.0).iter().map(|p| p * p).sum();
    let n = 40_000;
    let (mean, sd) = (n as f64 * chance, (n as f64 * chance * (1.0 - chance)).sqrt());
    for (pool_seed, request_seed) in [(5u64, 5 ^ 0x706f_6f6c_6e6f_6973), (5, 5), (0, 0x706f_6f6c_6e6f_6973)] {
        let (agree, agree_xored) = agreement_with_requests(&x, pool_seed, request_seed, n);
        let z = (agree as f64 - mean) / sd;
        let z_xored = (agree_xored as f64 - mean) / sd;
        eprintln!(
            "pool seed {pool_seed:#x}, requests seeded {request_seed:#x}: the same token in {agree} of {n} rows \
             ({:.3}%, chance {:.3}%, z {z:.2}); with the xored domain {agree_xored} ({:.2}%, z {z_xored:.1})",
            100.0 * agree as f64 / n as f64,
            100.0 * chance,
            100.0 * agree_xored as f64 / n as f64
        );
        // 5 standard deviations: about 217 +- 73 of 40,000 rows, where the xored domain gave thousands.
        assert!(
            z.abs() < 5.0,
            "pool seed {pool_seed:#x} and requests seeded {request_seed:#x} agree in {agree} of {n} rows"
        );
    }
}
