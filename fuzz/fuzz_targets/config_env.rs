//! Configuration: the `TOKENRACE_*` environment variables and the config structs.
//!
//! Each input is a set of environment assignments (names from `SETTINGS`, the binding's own
//! `TOKENRACE_*` names and random `TOKENRACE_*` names; values of random bytes, non-UTF-8 too, or
//! near-valid values: numbers at the ends of the ranges, with signs, spaces and Unicode
//! whitespace, choices in odd case), a `tokenrace_config` and a `tokenrace_pool_config` of
//! arbitrary bytes and struct size.
//!
//! 1. In this process, every UTF-8 value goes through its `SETTINGS` row: no panic, and it is
//!    accepted exactly when the row's documented `accepted` text says it is (the integer range,
//!    the list of names, "a finite number >= 0", "empty or an integer"); an accepted value keeps
//!    `Config::validate()` passing.
//! 2. The environment is read once per process, so a forked child sets the variables and
//!    checks `tokenrace::config_from_env`, `tokenrace_config_from_env`,
//!    `tokenrace_pool_config_from_env`, `tokenrace_simd_level`, `tokenrace_sampler_new(NULL)`
//!    and `tokenrace_pool_new(NULL)`: a bad value (the first in table order, non-UTF-8 first)
//!    gives INVALID_CONFIG naming the variable, and `*out` untouched; good values give the config
//!    they describe; odd `struct_size`s are refused or honoured as documented; a second read after
//!    the environment changed returns the same (cached) result. The child reports a failure by
//!    its exit status, and the parent then panics, so the input is saved as a crash.
//! 3. In this process, `tokenrace_sampler_new` and `tokenrace_pool_new` with the arbitrary
//!    struct bytes: the status is the one the documented rules give (size, bytes past the
//!    struct, enum fields, ranges, the sampler's pool, the CPU's SIMD levels, an impossible
//!    allocation), `*out` is untouched on failure, and a sampler reports the SIMD level asked for.

#![no_main]

#[path = "../common/mod.rs"]
mod common;

use arbitrary::{Result, Unstructured};
use common::*;
use libfuzzer_sys::fuzz_target;
use std::ffi::{CStr, OsStr};
use std::mem::size_of;
use std::os::unix::ffi::OsStrExt;
use tokenrace::internals::api::*;
use tokenrace::internals::types::*;
use tokenrace::internals::{Apply, SETTINGS};
use tokenrace::{Config, PoolConfig, SimdChoice, SimdLevel};

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});

const BINDING_VARS: [&str; 4] = ["TOKENRACE_LIBRARY", "TOKENRACE_LIB_DIR", "TOKENRACE_BLESS", "TOKENRACE_CI_S390X"];

/// A value near what a setting accepts.
fn near_value(u: &mut Unstructured, accepted: &str) -> Result<Vec<u8>> {
    let ws = [" ", "\t", "\n", "\u{a0}", "\u{3000}", "\r\n", "\u{b}", ""];
    let pre = ws[u.choose_index(ws.len())?];
    let post = ws[u.choose_index(ws.len())?];
    let core: String = if let Some((lo, hi)) = int_range(accepted) {
        let n: i128 = match u.int_in_range(0..=7u8)? {
            0 => lo as i128,
            1 => hi as i128,
            2 => lo as i128 - 1,
            3 => hi as i128 + 1,
            4 => u64::MAX as i128 + 1,
            5 => -1,
            _ => u.int_in_range(lo..=hi.min(lo + 5000))? as i128,
        };
        match u.int_in_range(0..=5u8)? {
            0 => format!("+{n}"),
            1 => format!("00{n}"),
            2 => format!("{n}.0"),
            3 => format!("0x{n:x}"),
            4 => format!("{n}e0"),
            _ => n.to_string(),
        }
    } else if accepted.starts_with("a finite number") {
        let c = [
            "1e-5",
            "0",
            "-0",
            "-0.0",
            "1e39",
            "3.4028235e38",
            "inf",
            "NaN",
            "-1e-45",
            "1e-46",
            ".5",
            "5.",
            "+1",
            "1_0",
        ];
        c[u.choose_index(c.len())?].to_string()
    } else if accepted.starts_with("empty") {
        let c = ["", "0", "18446744073709551615", "18446744073709551616", "-1", "42", " "];
        c[u.choose_index(c.len())?].to_string()
    } else {
        let names: Vec<&str> = accepted.split(", ").collect();
        let name = names[u.choose_index(names.len())?];
        match u.int_in_range(0..=4u8)? {
            0 => name.to_uppercase(),
            1 => format!("{name}x"),
            2 => name[..name.len() - 1].to_string(),
            3 => name.replace('i', "\u{130}"), // a non-ASCII capital I
            _ => name.to_string(),
        }
    };
    let mut v = format!("{pre}{core}{post}").into_bytes();
    if one_in(u, 12)? {
        // Not UTF-8.
        let bad: [&[u8]; 4] = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"];
        let at = u.int_in_range(0..=v.len())?;
        let b = bad[u.choose_index(4)?];
        v.splice(at..at, b.iter().copied());
    }
    Ok(v)
}

/// The range of an "an integer in [lo, hi]..." accepted text.
fn int_range(accepted: &str) -> Option<(u64, u64)> {
    let rest = accepted.strip_prefix("an integer in [")?;
    let (lo, rest) = rest.split_once(", ")?;
    let (hi, _) = rest.split_once(']')?;
    Some((lo.parse().ok()?, hi.parse().ok()?))
}

/// Whether a value is one the `accepted` text describes (the spec side of check 1).
fn accepted_by_doc(accepted: &str, v: &str) -> bool {
    let t = v.trim();
    if let Some((lo, hi)) = int_range(accepted) {
        return t.parse::<u64>().is_ok_and(|n| (lo..=hi).contains(&n));
    }
    if accepted.starts_with("empty (OS entropy) or an integer in [0, 18446744073709551615]") {
        return t.is_empty() || t.parse::<u64>().is_ok();
    }
    if accepted == "a finite number >= 0" {
        return t.parse::<f32>().is_ok_and(|x| x.is_finite() && x >= 0.0);
    }
    accepted.split(", ").any(|name| name.eq_ignore_ascii_case(t) && name.len() == t.len())
}

/// The effective environment of an input: (name, value) with later assignments winning.
fn assignments(u: &mut Unstructured) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut vars: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for _ in 0..u.int_in_range(0..=8u8)? {
        let (name, accepted): (Vec<u8>, Option<&str>) = match u.int_in_range(0..=9u8)? {
            0..=6 => {
                let s = &SETTINGS[u.choose_index(SETTINGS.len())?];
                (s.var.as_bytes().to_vec(), Some(s.accepted))
            }
            7 => (BINDING_VARS[u.choose_index(4)?].as_bytes().to_vec(), None),
            _ => {
                let mut n = b"TOKENRACE_".to_vec();
                let len = u.int_in_range(0..=12usize)?;
                n.extend(u.bytes(len)?.iter().copied().filter(|&b| b != 0 && b != b'='));
                if n.len() == 10 {
                    n.push(b'X');
                }
                (n, None)
            }
        };
        let value = match (accepted, u.int_in_range(0..=3u8)?) {
            (Some(acc), 0..=2) => near_value(u, acc)?,
            _ => {
                let len = u.int_in_range(0..=24usize)?;
                u.bytes(len)?.iter().copied().filter(|&b| b != 0).collect()
            }
        };
        vars.retain(|(n, _)| *n != name);
        vars.push((name, value));
    }
    Ok(vars)
}

/// What `from_env` must return for these variables: Ok, or Err(the variable it must name).
fn expected_env(vars: &[(Vec<u8>, Vec<u8>)]) -> std::result::Result<(Config, PoolConfig), &'static str> {
    let lookup = |var: &str| vars.iter().find(|(n, _)| n == var.as_bytes()).map(|(_, v)| v.as_slice());
    for s in SETTINGS {
        if lookup(s.var).is_some_and(|v| std::str::from_utf8(v).is_err()) {
            return Err(s.var);
        }
    }
    let (mut cfg, mut pool) = (Config::default(), PoolConfig::default());
    for s in SETTINGS {
        if let Some(v) = lookup(s.var) {
            let v = std::str::from_utf8(v).unwrap();
            let r = match &s.apply {
                Apply::Sampler(f) => f(&mut cfg, v),
                Apply::Pool(f) => f(&mut pool, v),
            };
            if r.is_err() {
                return Err(s.var);
            }
        }
    }
    Ok((cfg, pool))
}

/// Check 1: each UTF-8 value through its table row.
fn check_table(vars: &[(Vec<u8>, Vec<u8>)]) {
    for s in SETTINGS {
        for (_, v) in vars.iter().filter(|(n, _)| n == s.var.as_bytes()) {
            let Ok(v) = std::str::from_utf8(v) else { continue };
            let (mut cfg, mut pool) = (Config::default(), PoolConfig::default());
            let r = match &s.apply {
                Apply::Sampler(f) => f(&mut cfg, v),
                Apply::Pool(f) => f(&mut pool, v),
            };
            let doc = accepted_by_doc(s.accepted, v);
            assert_eq!(r.is_ok(), doc, "{}={v:?}: parsed {r:?}, but `{}` says {doc}", s.var, s.accepted);
            if let Err(why) = r {
                assert!(!why.is_empty(), "{}: an empty reason", s.var);
            } else {
                cfg.validate().unwrap_or_else(|e| panic!("{}={v:?} accepted but the config is invalid: {e}", s.var));
                pool.vocab = pool.vocab.max(1);
                pool.validate()
                    .unwrap_or_else(|e| panic!("{}={v:?} accepted but the pool config is invalid: {e}", s.var));
            }
        }
    }
}

fn simd_value(c: SimdChoice) -> u32 {
    match c {
        SimdChoice::Auto => 0,
        SimdChoice::Scalar => 1,
        SimdChoice::Portable => 2,
        SimdChoice::Avx2 => 3,
        SimdChoice::Avx512 => 4,
        SimdChoice::Neon => 5,
        SimdChoice::Vxe2 => 6,
    }
}

fn level_of(simd: u32) -> Option<SimdLevel> {
    let best = tokenrace::best_level();
    let l = match simd {
        0 => return Some(best),
        1 => SimdLevel::Scalar,
        2 => SimdLevel::Portable,
        3 => SimdLevel::Avx2,
        4 => SimdLevel::Avx512,
        5 => SimdLevel::Neon,
        _ => SimdLevel::Vxe2,
    };
    l.is_supported().then_some(l)
}

fn config_c(c: &Config) -> tokenrace_config {
    tokenrace_config {
        struct_size: size_of::<tokenrace_config>() as u32,
        vocab_size: c.vocab_size as u32,
        max_rows: c.max_rows as u32,
        threads: c.threads as u32,
        seed: c.seed.unwrap_or(0),
        has_seed: c.seed.is_some() as u32,
        simd: simd_value(c.simd),
        greedy_below: c.greedy_below,
        log_level: c.log_level as u32,
        noise: c.noise as u32,
        pool_rows: c.pool_rows as u32,
        filter_order: match c.filter_order {
            tokenrace::FilterOrder::TemperatureFirst => 0,
            tokenrace::FilterOrder::FiltersFirst => 1,
        },
        reserved1: 0,
    }
}

fn pool_c(p: &PoolConfig) -> tokenrace_pool_config {
    tokenrace_pool_config {
        struct_size: size_of::<tokenrace_pool_config>() as u32,
        rows: p.rows as u32,
        vocab: p.vocab as u32,
        kind: p.kind as u32,
        threads: p.threads as u32,
        has_seed: p.seed.is_some() as u32,
        seed: p.seed.unwrap_or(0),
        policy: p.policy as u32,
        reserved0: 0,
        timeout_ms: p.timeout_ms,
    }
}

fn bytes_of<T>(v: &T) -> Vec<u8> {
    // SAFETY: the C structs here have no padding (the library's layout test checks it).
    unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }.to_vec()
}

#[repr(C, align(8))]
#[derive(Clone)]
struct Raw([u8; 128]);

/// A `*_from_env(out)` call: `size` is the caller's struct_size (None: out is NULL).
fn check_from_env<T>(
    call: &str,
    f: unsafe extern "C" fn(*mut T) -> tokenrace_status,
    size: Option<u32>,
    want: std::result::Result<Vec<u8>, &'static str>,
) {
    let mut raw = Raw([0xab; 128]);
    if let Some(s) = size {
        raw.0[..4].copy_from_slice(&s.to_ne_bytes());
    }
    let before = raw.clone();
    let p = if size.is_some() { raw.0.as_mut_ptr() as *mut T } else { std::ptr::null_mut() };
    // SAFETY: NULL or 128 writable bytes, at least struct_size (sizes are chosen <= 128).
    let st = code(unsafe { f(p) }, call);
    let err = check_last_error(st, call);
    // The struct's size, and the sizes that end on a field from the first version (48) on.
    let full = size_of::<T>();
    let ends: &[usize] = if full == CFG { &[48, 52, CFG] } else { &[48] };
    match (&want, size) {
        (Err(var), _) => {
            assert_eq!(st, INVALID_CONFIG, "{call}: bad {var} but status {}", status_name(st));
            assert!(err.contains(var) && err.contains("accepted values"), "{call}: {err:?} does not name {var}");
        }
        (Ok(_), None) => assert_eq!(st, INVALID_ARGUMENT, "{call}(NULL)"),
        (Ok(want), Some(s)) => {
            if (s as usize) < full && !ends.contains(&(s as usize)) {
                assert_eq!(st, INVALID_ARGUMENT, "{call}: struct_size {s}");
            } else {
                assert_eq!(st, OK, "{call}: struct_size {s}: {err}");
                let n = full.min(s as usize);
                let mut w = want.clone();
                w[..4].copy_from_slice(&(n as u32).to_ne_bytes());
                assert!(raw.0[..n] == w[..n], "{call}: wrote {:?}, want {:?}", &raw.0[..n], &w[..n]);
                assert!(raw.0[n..] == before.0[n..], "{call}: wrote past struct_size {s}");
                return;
            }
        }
    }
    assert!(raw.0 == before.0, "{call} failed but wrote into *out");
}

/// Check 2, in a child process with the variables set. Panics on a violation.
fn child(vars: &[(Vec<u8>, Vec<u8>)], sizes: [Option<u32>; 2], make: bool) {
    let old: Vec<_> = std::env::vars_os().map(|(k, _)| k).filter(|k| k.as_bytes().starts_with(b"TOKENRACE_")).collect();
    for k in old {
        std::env::remove_var(k);
    }
    for (n, v) in vars {
        std::env::set_var(OsStr::from_bytes(n), OsStr::from_bytes(v));
    }
    let want = expected_env(vars);
    if verbose() {
        eprintln!("env: {:?}", want.as_ref().map(|_| ()));
    }
    let got = tokenrace::config_from_env();
    match (&want, &got) {
        (Ok(w), Ok(g)) => assert!(w == g, "config_from_env: {g:?}, want {w:?}"),
        (Err(var), Err(e)) => {
            assert_eq!(e.kind, tokenrace::ErrorKind::InvalidConfig, "{e:?}");
            assert!(e.message.starts_with(&format!("{var}: ")), "config_from_env: {:?} does not name {var}", e.message);
        }
        _ => panic!("config_from_env: {got:?}, want {want:?}"),
    }
    let c_want = want.as_ref().map(|(c, _)| bytes_of(&config_c(c))).map_err(|v| *v);
    check_from_env("tokenrace_config_from_env", tokenrace_config_from_env, sizes[0], c_want);
    let p_want = want.as_ref().map(|(_, p)| bytes_of(&pool_c(p))).map_err(|v| *v);
    check_from_env("tokenrace_pool_config_from_env", tokenrace_pool_config_from_env, sizes[1], p_want);

    // SAFETY: a static NUL-terminated string.
    let level = unsafe { CStr::from_ptr(tokenrace_simd_level()) }.to_str().unwrap();
    let want_level =
        want.as_ref().ok().and_then(|(c, _)| level_of(simd_value(c.simd))).unwrap_or_else(tokenrace::best_level);
    assert_eq!(level, want_level.name(), "tokenrace_simd_level");

    if make {
        // tokenrace_sampler_new(NULL): the environment's config, when it is cheap to make.
        let cheap = want.as_ref().map_or(true, |(c, _)| {
            let pool_rows = if c.pool_rows == 0 { (4 * c.max_rows).min(1 << 20) } else { c.pool_rows };
            c.threads <= 8 && (c.noise != tokenrace::NoiseSource::Pool || pool_rows * c.vocab_size <= 1 << 18)
        });
        if cheap {
            let expect = match &want {
                Err(_) => INVALID_CONFIG,
                Ok((c, _)) => {
                    let pool_rows = if c.pool_rows == 0 { (4 * c.max_rows).min(1 << 20) } else { c.pool_rows };
                    if level_of(simd_value(c.simd)).is_none() {
                        UNSUPPORTED
                    } else if c.noise == tokenrace::NoiseSource::Pool && (c.vocab_size == 0 || pool_rows < c.max_rows) {
                        INVALID_CONFIG
                    } else {
                        OK
                    }
                }
            };
            let sentinel = std::ptr::NonNull::<tokenrace_sampler>::dangling().as_ptr();
            let mut s = sentinel;
            // SAFETY: NULL config (the environment's), a writable out.
            let st = code(unsafe { tokenrace_sampler_new(std::ptr::null(), &mut s) }, "tokenrace_sampler_new");
            let err = check_last_error(st, "tokenrace_sampler_new");
            assert_eq!(st, expect, "tokenrace_sampler_new(NULL): {err}");
            if let Err(var) = &want {
                assert!(err.contains(var), "tokenrace_sampler_new(NULL): {err:?} does not name {var}");
            }
            if st == OK {
                // SAFETY: just made.
                unsafe { tokenrace_sampler_free(s) };
            } else {
                assert_eq!(s, sentinel, "tokenrace_sampler_new failed but wrote *out");
            }
        }
        // tokenrace_pool_new(NULL).
        let cheap = want.as_ref().map_or(true, |(_, p)| p.threads <= 8 && p.rows * p.vocab <= 1 << 18);
        if cheap {
            let expect = match &want {
                Err(_) => INVALID_CONFIG,
                Ok((_, p)) if p.vocab == 0 => INVALID_CONFIG,
                Ok(_) => OK,
            };
            let sentinel = std::ptr::NonNull::<tokenrace_pool>::dangling().as_ptr();
            let mut p = sentinel;
            // SAFETY: NULL config (the environment's), a writable out.
            let st = code(unsafe { tokenrace_pool_new(std::ptr::null(), &mut p) }, "tokenrace_pool_new");
            let err = check_last_error(st, "tokenrace_pool_new");
            assert_eq!(st, expect, "tokenrace_pool_new(NULL): {err}");
            if st == OK {
                // SAFETY: just made.
                unsafe { tokenrace_pool_free(p) };
            } else {
                assert_eq!(p, sentinel, "tokenrace_pool_new failed but wrote *out");
            }
        }
    }

    // Read once per process: a changed environment changes nothing.
    std::env::set_var("TOKENRACE_SIMD", "bogus");
    std::env::set_var("TOKENRACE_MAX_ROWS", "7");
    std::env::remove_var("TOKENRACE_POOL_KIND");
    let again = tokenrace::config_from_env();
    assert!(format!("{again:?}") == format!("{got:?}"), "config_from_env changed: {again:?} after {got:?}");
}

fn run_child(vars: &[(Vec<u8>, Vec<u8>)], sizes: [Option<u32>; 2], make: bool) {
    // The fork is sound: no thread of this process holds a lock the child needs (every
    // sampler and pool of this process is freed).
    let status = fork_and_wait(|| child(vars, sizes, make));
    let printable: Vec<(String, String)> = vars
        .iter()
        .map(|(n, v)| (String::from_utf8_lossy(n).into_owned(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the environment check failed in the child (status {status:#x}) for {printable:?}, sizes {sizes:?}"
    );
}

fn struct_size(u: &mut Unstructured) -> Result<u32> {
    // 48 (the struct's size) when the input is used up, so that short inputs reach the checks.
    Ok(match u.int_in_range(0..=9u8)? {
        5 => u.int_in_range(0..=128u32)?,
        6 => 47,
        7 => 4,
        8 => 56,
        9 => 128,
        _ => 48,
    })
}

/// The size of `tokenrace_config` (its first version ends at 48 bytes, with `pool_rows`).
const CFG: usize = size_of::<tokenrace_config>();

/// Check 3: a sampler from arbitrary config bytes.
#[allow(clippy::if_same_then_else)] // one branch per stage of the library's checks
fn sampler_from_bytes(u: &mut Unstructured) -> Result<()> {
    let mut raw = Raw([0; 128]);
    let size = struct_size(u)? as usize;
    let def = bytes_of(&tokenrace_config_default());
    raw.0[..CFG].copy_from_slice(&def);
    // Overwrite some fields, or every byte.
    if one_in(u, 4)? {
        u.fill_buffer(&mut raw.0[4..size.max(4)])?;
    } else {
        for _ in 0..u.int_in_range(0..=4u8)? {
            let off = [4usize, 8, 12, 16, 24, 28, 32, 36, 40, 44, 48][u.choose_index(11)?];
            let v: u32 = match u.int_in_range(0..=3u8)? {
                0 => u.arbitrary()?,
                1 => u.int_in_range(0..=5)?,
                2 => 1 << u.int_in_range(0..=31)?,
                _ => u.int_in_range(0..=1100)?,
            };
            raw.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        }
        if size > CFG && one_in(u, 3)? {
            raw.0[u.int_in_range(CFG..=size - 1)?] = 1;
        }
    }
    // `reserved1` stays zero (what the library makes of it is not a rule).
    raw.0[52..56].fill(0);
    raw.0[..4].copy_from_slice(&(size as u32).to_ne_bytes());
    let f = |raw: &Raw, off: usize| u32::from_ne_bytes(raw.0[off..off + 4].try_into().unwrap());
    // Tame the valid-but-expensive: many threads, a pool of megabytes to gigabytes.
    if (9..=1024).contains(&f(&raw, 12)) {
        let t = f(&raw, 12) % 9;
        raw.0[12..16].copy_from_slice(&t.to_ne_bytes());
    }
    let (vocab, max_rows, pool_rows) = (f(&raw, 4) as u64, f(&raw, 8) as u64, f(&raw, 44) as u64);
    let rows_eff = if pool_rows == 0 { (4 * max_rows).min(1 << 20) } else { pool_rows };
    let bytes = rows_eff * vocab * 4;
    if f(&raw, 40) == 2 && bytes > 1 << 20 && bytes < 1 << 41 {
        let v = (vocab % 1024) as u32 + 1;
        raw.0[4..8].copy_from_slice(&v.to_ne_bytes());
    }
    if f(&raw, 40) == 2 && rows_eff * 16 > 1 << 20 && bytes < 1 << 41 {
        // The pool's slot table alone would be megabytes.
        raw.0[40..44].copy_from_slice(&1u32.to_ne_bytes());
    }

    // The rules, in the order the library applies them.
    let extra = size > CFG && raw.0[CFG..size].iter().any(|&b| b != 0);
    // `filter_order` (after the first version's `pool_rows`) is read when the size covers it.
    let filter_order = if size >= 52 { f(&raw, 48) } else { 0 };
    let (vocab, max_rows, threads, pool_rows) = (f(&raw, 4), f(&raw, 8), f(&raw, 12), f(&raw, 44));
    let greedy = f32::from_bits(f(&raw, 32));
    let (simd, log_level, noise) = (f(&raw, 28), f(&raw, 36), f(&raw, 40));
    let rows_eff = if pool_rows == 0 { (4 * max_rows as u64).min(1 << 20) } else { pool_rows as u64 };
    let expect = if size < 48 || (size < CFG && size != 48 && size != 52) {
        INVALID_ARGUMENT
    } else if extra {
        UNSUPPORTED
    } else if simd > 4 || log_level > 5 || noise > 2 || filter_order > 1 {
        INVALID_CONFIG
    } else if vocab > i32::MAX as u32
        || !(1..=1 << 20).contains(&max_rows)
        || threads > 1024
        || !(greedy.is_finite() && greedy >= 0.0)
        || pool_rows > 1 << 20
    {
        INVALID_CONFIG
    } else if level_of(simd).is_none() {
        UNSUPPORTED
    } else if noise == 2 && (vocab == 0 || rows_eff < max_rows as u64) {
        INVALID_CONFIG
    } else if noise == 2 && rows_eff * vocab as u64 * 4 >= 1 << 41 {
        OUT_OF_MEMORY
    } else {
        OK
    };
    let sentinel = std::ptr::NonNull::<tokenrace_sampler>::dangling().as_ptr();
    let mut s = sentinel;
    // SAFETY: 128 readable bytes, at least struct_size; a writable out.
    let st = code(
        unsafe { tokenrace_sampler_new(raw.0.as_ptr() as *const tokenrace_config, &mut s) },
        "tokenrace_sampler_new",
    );
    let err = check_last_error(st, "tokenrace_sampler_new");
    if verbose() {
        eprintln!("sampler from bytes: {} {err}", status_name(st));
    }
    assert_eq!(st, expect, "tokenrace_sampler_new({:?}): {err}", &raw.0[..size.max(48)]);
    if st == OK {
        // SAFETY: a live sampler; the name is static.
        let name = unsafe { CStr::from_ptr(tokenrace_sampler_simd_level(s)) }.to_str().unwrap();
        assert_eq!(name, level_of(simd).unwrap().name());
        // SAFETY: just made.
        unsafe { tokenrace_sampler_free(s) };
    } else {
        assert_eq!(s, sentinel, "tokenrace_sampler_new failed but wrote *out");
    }
    Ok(())
}

/// Check 3: a pool from arbitrary pool config bytes.
#[allow(clippy::if_same_then_else)] // one branch per stage of the library's checks
fn pool_from_bytes(u: &mut Unstructured) -> Result<()> {
    let mut raw = Raw([0; 128]);
    let size = struct_size(u)? as usize;
    let mut def = tokenrace_pool_config_default();
    def.vocab = u.int_in_range(1..=300)?;
    raw.0[..48].copy_from_slice(&bytes_of(&def));
    if one_in(u, 4)? {
        u.fill_buffer(&mut raw.0[4..size.max(4)])?;
    } else {
        for _ in 0..u.int_in_range(0..=4u8)? {
            let off = [4usize, 8, 12, 16, 20, 24, 32, 36, 40][u.choose_index(9)?];
            let v: u32 = match u.int_in_range(0..=3u8)? {
                0 => u.arbitrary()?,
                1 => u.int_in_range(0..=3)?,
                2 => 1 << u.int_in_range(0..=31)?,
                _ => u.int_in_range(0..=70)?,
            };
            raw.0[off..off + 4].copy_from_slice(&v.to_ne_bytes());
        }
        if size > 48 && one_in(u, 3)? {
            raw.0[u.int_in_range(48..=size - 1)?] = 1;
        }
    }
    raw.0[..4].copy_from_slice(&(size as u32).to_ne_bytes());
    let f = |raw: &Raw, off: usize| u32::from_ne_bytes(raw.0[off..off + 4].try_into().unwrap());
    if (5..=64).contains(&f(&raw, 16)) {
        let t = f(&raw, 16) % 4 + 1;
        raw.0[16..20].copy_from_slice(&t.to_ne_bytes());
    }
    let bytes = f(&raw, 4) as u64 * f(&raw, 8) as u64 * 4;
    if bytes > 1 << 20 && bytes < 1 << 41 {
        let rows = f(&raw, 4) % 64 + 1;
        let vocab = f(&raw, 8) % 2048 + 1;
        raw.0[4..8].copy_from_slice(&rows.to_ne_bytes());
        raw.0[8..12].copy_from_slice(&vocab.to_ne_bytes());
    }
    if f(&raw, 4) > 1 << 16 && f(&raw, 4) <= 1 << 20 && (f(&raw, 4) as u64 * f(&raw, 8) as u64 * 4) < 1 << 41 {
        let rows = f(&raw, 4) % 4096 + 1;
        raw.0[4..8].copy_from_slice(&rows.to_ne_bytes());
    }
    let extra = size > 48 && raw.0[48..size].iter().any(|&b| b != 0);
    let (rows, vocab, kind, threads, policy) = (f(&raw, 4), f(&raw, 8), f(&raw, 12), f(&raw, 16), f(&raw, 32));
    let timeout = u64::from_ne_bytes(raw.0[40..48].try_into().unwrap());
    let expect = if size < 48 {
        INVALID_ARGUMENT
    } else if extra {
        UNSUPPORTED
    } else if kind > 1 || policy > 1 {
        INVALID_CONFIG
    } else if !(1..=1 << 20).contains(&rows)
        || !(1..=i32::MAX as u32).contains(&vocab)
        || !(1..=64).contains(&threads)
        || timeout > 3_600_000
    {
        INVALID_CONFIG
    } else if rows as u64 * vocab as u64 * 4 >= 1 << 41 {
        OUT_OF_MEMORY
    } else {
        OK
    };
    let sentinel = std::ptr::NonNull::<tokenrace_pool>::dangling().as_ptr();
    let mut p = sentinel;
    // SAFETY: 128 readable bytes, at least struct_size; a writable out.
    let st = code(
        unsafe { tokenrace_pool_new(raw.0.as_ptr() as *const tokenrace_pool_config, &mut p) },
        "tokenrace_pool_new",
    );
    let err = check_last_error(st, "tokenrace_pool_new");
    if verbose() {
        eprintln!("pool from bytes: {} {err}", status_name(st));
    }
    assert_eq!(st, expect, "tokenrace_pool_new({:?}): {err}", &raw.0[..size.max(48)]);
    if st == OK {
        // SAFETY: just made.
        unsafe { tokenrace_pool_free(p) };
    } else {
        assert_eq!(p, sentinel, "tokenrace_pool_new failed but wrote *out");
    }
    Ok(())
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let u = &mut u;
    let vars = assignments(u)?;
    check_table(&vars);
    let mut sizes = [None, None];
    for s in sizes.iter_mut() {
        *s = if one_in(u, 16)? { None } else { Some(struct_size(u)?) };
    }
    let make = u.arbitrary::<bool>()?;
    run_child(&vars, sizes, make);
    // Making a sampler or a pool reads the environment (for the log level), which is then cached
    // for the process: made here, it would leave every later child the parent's cache. So these
    // run in a child too.
    in_child("the struct checks", || {
        let _ = sampler_from_bytes(u);
        let _ = pool_from_bytes(u);
    });
    Ok(())
}

/// Runs `f` in a forked child (with the panic hook of `run_child`); a panic there fails the
/// input.
fn in_child(what: &str, f: impl FnOnce()) {
    // The fork is sound: this process makes no sampler or pool, so no thread of it holds a
    // lock the child needs.
    let status = fork_and_wait(f);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{what} failed in the child (status {status:#x})"
    );
}

/// Runs `f` in a forked child, a panic there leaving it with status 86, and returns the child's
/// wait status. The caller makes sure that no thread of this process holds a lock `f` needs.
fn fork_and_wait(f: impl FnOnce()) -> i32 {
    // SAFETY: fork; the child only runs `f` and leaves with _exit (see the caller for locks).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        std::panic::set_hook(Box::new(|info| {
            eprintln!("config_env child: {info}");
            // SAFETY: leaves the child at once.
            unsafe { libc::_exit(86) };
        }));
        f();
        // SAFETY: as above.
        unsafe { libc::_exit(0) };
    }
    let mut status = 0;
    let r = loop {
        // SAFETY: our child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r != -1 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            break r;
        }
    };
    assert_eq!(r, pid, "waitpid: {}", std::io::Error::last_os_error());
    status
}
