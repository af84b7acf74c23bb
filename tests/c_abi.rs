//! The C and C++ programs in `c_tests/` and `examples/cpp/`, compiled with the system C/C++
//! compiler (found by the `cc` crate) against `include/tokenrace.h` (and `tokenrace.hpp`) and the
//! built `libtokenrace.so`, linked with it or loading it at run time, then run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The directory of `libtokenrace.so`: `TOKENRACE_LIB_DIR` when set (scripts/test.sh points it at
/// `target/debug/deps`, where `cargo test` leaves the shared object of the test build), else
/// built here with this test's profile and target directory (`cargo build --lib`).
fn lib_dir() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let dir = find_or_build_lib_dir();
            link_soname(&dir);
            dir
        })
        .clone()
}

/// A program linked with `-ltokenrace` asks the dynamic loader for the soname, which the build
/// directory lacks (an install makes it): a symlink to the built file stands in for it.
fn link_soname(dir: &Path) {
    let link = dir.join(env!("LIBTOKENRACE_SONAME"));
    if std::fs::read_link(&link).is_err() {
        let _ = std::fs::remove_file(&link);
        // Another test binary may make it at the same moment; either link serves.
        let _ = std::os::unix::fs::symlink("libtokenrace.so", &link);
    }
    assert!(link.exists(), "cannot make the soname link {}", link.display());
}

/// `TOKENRACE_LIB_DIR`, or the shared object built here with this test's profile.
fn find_or_build_lib_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOKENRACE_LIB_DIR") {
        let dir = PathBuf::from(dir);
        assert!(dir.join("libtokenrace.so").exists(), "TOKENRACE_LIB_DIR has no libtokenrace.so: {}", dir.display());
        return dir;
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let target_dir = dir.parent().unwrap();
    let release = dir.file_name().is_some_and(|n| n == "release");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--lib", "--quiet"])
        .args(release.then_some("--release"))
        .arg("--manifest-path")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target_dir)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building libtokenrace.so failed");
    assert!(dir.join("libtokenrace.so").exists(), "no libtokenrace.so in {}", dir.display());
    dir
}

fn compiler(cpp: bool) -> cc::Tool {
    let target = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    cc::Build::new()
        .cpp(cpp)
        .target(&target)
        .host(&target)
        .opt_level(1)
        .cargo_metadata(false)
        .cargo_warnings(false)
        .get_compiler()
}

/// Whether the programs run under valgrind's memcheck (`TOKENRACE_VALGRIND=1`, as
/// scripts/test.sh does when valgrind is installed).
fn memcheck_requested() -> bool {
    std::env::var_os("TOKENRACE_VALGRIND").is_some_and(|v| v == "1")
}

/// The command that runs `program`: under memcheck, any invalid access, uninitialised read or
/// leak (definite, indirect or possible) fails it with status 99.
fn run_command(program: &Path, memcheck: bool) -> Command {
    if !memcheck {
        return Command::new(program);
    }
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "-q",
        "--error-exitcode=99",
        "--leak-check=full",
        "--show-leak-kinds=definite,indirect,possible",
        "--errors-for-leak-kinds=definite,indirect,possible",
    ]);
    cmd.arg(program);
    cmd
}

/// A file in the temporary directory, unique to this test process and `name`.
fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tokenrace-{}-{}", std::process::id(), name.replace(['/', '.'], "_")))
}

/// A C or C++ program of the repository (`source`, relative to its root), how to build it and
/// how to run it.
struct Program {
    source: String,
    cpp: bool,
    /// Linked with `-ltokenrace` (else with `-ldl` only: the program must load the library).
    link: bool,
    /// `-std=` for C++ programs.
    cpp_std: &'static str,
    args: Vec<String>,
    envs: Vec<(String, String)>,
    limit: Duration,
    memcheck: bool,
}

impl Program {
    fn new(source: &str, cpp: bool, link: bool) -> Self {
        Program {
            source: source.to_string(),
            cpp,
            link,
            cpp_std: "c++17",
            args: Vec::new(),
            envs: Vec::new(),
            limit: QUICK,
            memcheck: memcheck_requested(),
        }
    }

    fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.envs.push((key.to_string(), value.into()));
        self
    }

    /// The compiler command for the source, without the output (`-o`, `-c`, `-fsyntax-only`).
    fn compile_command(&self) -> Command {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut cmd = compiler(self.cpp).to_command();
        cmd.arg(root.join(&self.source)).arg("-I").arg(root.join("include"));
        cmd.args(["-Wall", "-Wextra", "-Werror", "-pthread"]);
        if self.cpp {
            cmd.arg(format!("-std={}", self.cpp_std)).arg("-Wpedantic");
        } else {
            cmd.arg("-std=c11");
        }
        cmd
    }

    /// Checks that the source compiles (nothing is linked or run).
    fn compiles(&self) {
        let status = self.compile_command().arg("-fsyntax-only").status().expect("the C compiler runs");
        assert!(status.success(), "compiling {} as {} failed", self.source, self.cpp_std);
    }

    /// Compiles and links the program, runs it (under memcheck when `memcheck`), and fails the
    /// test when it fails or runs longer than `limit` (then it is killed: a hung program must fail
    /// the suite, not hang it).
    fn run(&self) {
        let out = temp_path(&self.source);
        let mut cmd = self.compile_command();
        cmd.arg("-o").arg(&out);
        if self.link {
            let lib = lib_dir();
            // DT_RPATH (not RUNPATH): searched before LD_LIBRARY_PATH, which `cargo test` points at
            // target/debug, where a libtokenrace.so of another build (a stale `cargo build`)
            // would otherwise be loaded instead of the one in `lib`.
            cmd.arg("-L").arg(&lib).arg("-ltokenrace").arg(format!("-Wl,-rpath,{}", lib.display()));
            cmd.arg("-Wl,--disable-new-dtags");
            cmd.arg("-lm");
        }
        cmd.arg("-ldl");
        let status = cmd.status().expect("the C compiler runs");
        assert!(status.success(), "compiling {} failed", self.source);
        // The output goes to files rather than pipes, so that waiting with a limit cannot block
        // on a full pipe.
        let (stdout_path, stderr_path) = (out.with_extension("stdout"), out.with_extension("stderr"));
        let mut child = run_command(&out, self.memcheck)
            .args(&self.args)
            .envs(self.envs.iter().map(|(k, v)| (k, v)))
            .stdout(std::fs::File::create(&stdout_path).unwrap())
            .stderr(std::fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break Some(status);
            }
            if start.elapsed() > self.limit {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let output = format!(
            "{}{}",
            std::fs::read_to_string(&stdout_path).unwrap_or_default(),
            std::fs::read_to_string(&stderr_path).unwrap_or_default()
        );
        for p in [&out, &stdout_path, &stderr_path] {
            let _ = std::fs::remove_file(p);
        }
        let (source, limit) = (&self.source, self.limit);
        let status = status.unwrap_or_else(|| panic!("{source} ran longer than {limit:?} and was killed:\n{output}"));
        assert!(status.success(), "{source} failed ({status}):\n{output}");
    }
}

/// Builds `source` (C, relative to the repository root) as a shared object named `name`, with
/// `defines`; the caller removes it.
fn build_shared_object(source: &str, name: &str, defines: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = temp_path(name).with_extension("so");
    let status = compiler(false)
        .to_command()
        .arg(root.join(source))
        .arg("-I")
        .arg(root.join("include"))
        .args(["-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"])
        .args(defines.iter().map(|d| format!("-D{d}")))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("the C compiler runs");
    assert!(status.success(), "building {name} from {source} failed");
    out
}

/// Compiles `source` (in `c_tests/`) and runs it with `args`.
fn build_and_run(source: &str, cpp: bool, link: bool, args: &[&str], limit: Duration) {
    let mut program = Program::new(&format!("c_tests/{source}"), cpp, link);
    program.args = args.iter().map(|a| a.to_string()).collect();
    program.limit = limit;
    program.run();
}

/// The limit of a program that should take a second or two (also under memcheck).
const QUICK: Duration = Duration::from_secs(120);

#[test]
fn c_caller_sees_statuses_messages_and_results() {
    build_and_run("test_basic.c", false, true, &[], QUICK);
}

/// The fields of the whole sampling step (since 0.2): CSR histories, penalties, bias, a bitmask
/// and full-vocabulary output against a plain draw of the row materialised by hand; an error's
/// message and nothing written; structs of the older sizes draw as before.
#[test]
fn c_caller_uses_the_sampling_step_fields_and_older_struct_sizes() {
    build_and_run("test_step.c", false, true, &[], QUICK);
}

/// `tokenrace_score`: a draw's tokens scored give back its logprob outputs bit for bit, the
/// stream unmoved; refusals name target_ids' row and write nothing.
#[test]
fn c_caller_scores_target_tokens() {
    build_and_run("test_score.c", false, true, &[], QUICK);
}

/// `tokenrace_verify` (speculative decoding, since 0.2): greedy acceptance, seeded requests alone,
/// with batch mates and on other streams (and their bonus row is the seeded draw), external
/// uniforms and noise and draft probabilities against a float64 reference, padding, counts,
/// strides, flags and logprobs, errors naming the field with nothing written, struct sizes.
#[test]
fn c_caller_verifies_draft_tokens() {
    build_and_run("test_verify.c", false, true, &[], QUICK);
}

/// The request state: requests added once and appended to after each draw, drawn by id, give
/// the tokens and logprobs of the same draws with CSR lists; refusals that write nothing.
#[test]
fn c_caller_draws_rows_named_by_request_id() {
    build_and_run("test_requests.c", false, true, &[], QUICK);
}

#[test]
fn the_library_works_through_dlopen() {
    let lib = lib_dir().join("libtokenrace.so");
    build_and_run("test_dlopen.c", false, false, &[lib.to_str().unwrap()], QUICK);
}

#[test]
fn the_cpp_wrapper_works() {
    build_and_run("test_cpp.cpp", true, true, &[], QUICK);
}

/// Loader mode: linked with `-ldl` only (TOKENRACE_HPP_NO_LINK, so a reference to any
/// tokenrace symbol would fail the link), the same checks as `test_cpp.cpp`, and the loader's
/// errors on a missing file, a library lacking functions, one of another ABI, and libm.
#[test]
fn the_cpp_wrapper_works_through_its_loader() {
    let lib = lib_dir();
    let lacking = build_shared_object("c_tests/fake_tokenrace.c", "fake_tokenrace_same_abi", &[]);
    let other_abi =
        build_shared_object("c_tests/fake_tokenrace.c", "fake_tokenrace_abi_999", &["FAKE_ABI_VERSION=999"]);
    // LD_LIBRARY_PATH: where Library::open_default() finds the library.
    let program = Program::new("c_tests/test_cpp_dlopen.cpp", true, false)
        .arg(lib.join("libtokenrace.so").to_str().unwrap())
        .arg(lacking.to_str().unwrap())
        .arg(other_abi.to_str().unwrap())
        .env("LD_LIBRARY_PATH", lib.to_str().unwrap());
    // The shared objects are removed before the verdict, which may panic.
    let outcome = std::panic::catch_unwind(|| program.run());
    let _ = std::fs::remove_file(&lacking);
    let _ = std::fs::remove_file(&other_abi);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The example of docs/integration-cpp.md: a serving loop that loads the library by path.
#[test]
fn the_cpp_dlopen_server_example_runs() {
    let lib = lib_dir().join("libtokenrace.so");
    Program::new("examples/cpp/dlopen_server.cpp", true, false).arg(lib.to_str().unwrap()).run();
}

/// The functions declared in `include/tokenrace.h`, without the `tokenrace_` prefix: every line
/// outside a comment that names `tokenrace_NAME(` (a declaration starts at the line's first
/// column; its parameters continue on indented lines).
fn header_functions() -> Vec<String> {
    let header = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/tokenrace.h")).unwrap();
    let mut names = Vec::new();
    for line in header.lines() {
        if line.starts_with([' ', '/', '#', '*', '}']) || line.starts_with("typedef") {
            continue;
        }
        let Some(at) = line.find('(') else { continue };
        let before = &line[..at];
        if let Some(start) = before.rfind("tokenrace_") {
            let name = &before[start + "tokenrace_".len()..];
            if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                names.push(name.to_string());
            }
        }
    }
    names
}

/// The names of the X-macro list `TOKENRACE_HPP_FUNCTIONS` of `include/tokenrace.hpp`.
fn hpp_functions() -> Vec<String> {
    let hpp = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/tokenrace.hpp")).unwrap();
    let start = hpp.find("#define TOKENRACE_HPP_FUNCTIONS(X)").expect("the X-macro list");
    let mut names = Vec::new();
    for line in hpp[start..].lines().skip(1) {
        let item = line.trim().trim_end_matches('\\').trim();
        let name = item.strip_prefix("X(").and_then(|s| s.strip_suffix(')')).expect("an X(name) line");
        names.push(name.to_string());
        if !line.trim_end().ends_with('\\') {
            break;
        }
    }
    names
}

/// The C++ wrapper's one list of the C functions (its function table, the linked table and the
/// loader) is every function of the C header, in its order: a function added to tokenrace.h
/// and not to tokenrace.hpp fails here.
#[test]
fn the_cpp_function_list_is_the_c_header() {
    let (c, cpp) = (header_functions(), hpp_functions());
    assert_eq!(cpp, c, "TOKENRACE_HPP_FUNCTIONS differs from the functions of tokenrace.h");
    assert_eq!(c.len(), 50, "{c:?}");
    assert!(c.iter().any(|n| n == "verify") && c.iter().any(|n| n == "abi_version"));
}

/// The header is C++17 and must stay valid C++20 (warnings included) in both modes.
#[test]
fn the_cpp_wrapper_compiles_as_cpp20() {
    for (source, link) in [
        ("c_tests/test_cpp.cpp", true),
        ("c_tests/test_cpp_dlopen.cpp", false),
        ("examples/cpp/dlopen_server.cpp", false),
    ] {
        let mut program = Program::new(source, true, link);
        program.cpp_std = "c++20";
        program.compiles();
    }
}

/// `include/tokenrace_llama.h`, the llama.cpp sampler over the fused draw, on a stand-in of
/// llama.h: llama.cpp's greedy and "keep one" cases, penalties over the accepted window,
/// candidates out of id order, seeded sequences, the distribution (chi-square with a power
/// check), refused parameters; and the same source compiles as C++ (the header is for both).
#[test]
fn the_llama_adapter_follows_llama_cpps_rules() {
    build_and_run("test_llama_adapter.c", false, true, &[], QUICK);
    let mut as_cpp = Program::new("c_tests/test_llama_adapter.c", true, true);
    as_cpp.cpp_std = "c++17";
    as_cpp.compiles();
}

#[test]
fn pool_shutdown_wakes_blocked_borrowers_and_keeps_the_handle() {
    build_and_run("test_pool_shutdown.c", false, true, &[], QUICK);
}

/// Children forked while threads draw must draw (seeded tokens equal to the parent's), and free
/// their samplers and pools, without hanging. The program bounds each child (10 s) and itself
/// (150 s); the limit here is only a backstop above those. Never under memcheck: a child keeps
/// what its parent's threads own (they do not exist there to free it), by design, which
/// memcheck would report as leaks.
#[test]
fn fork_children_draw_and_free() {
    if memcheck_requested() {
        eprintln!("test_fork.c: not run under memcheck (fork children leak their parent's threads' memory by design)");
        return;
    }
    let mut program = Program::new("c_tests/test_fork.c", false, true);
    program.limit = Duration::from_secs(240);
    program.memcheck = false;
    program.run();
}
