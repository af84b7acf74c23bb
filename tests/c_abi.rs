//! The C programs in `c_tests/`, compiled with the system C/C++ compiler (found by the `cc`
//! crate) against `include/tokenrace.h` and the built `libtokenrace.so`, then run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The directory of `libtokenrace.so`: `TOKENRACE_LIB_DIR` when set (scripts/test.sh builds
/// the release library once, before the tests, and every consumer uses that one), else built
/// here: `cargo test` builds the library as an rlib only, so the shared object is built with the
/// same profile and target directory (a third compile of the crate, minutes on a small machine).
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
    let link = dir.join(env!("TOKENRACE_SONAME"));
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

/// Compiles `source` and runs it with `args` (under memcheck when `memcheck`), failing the test
/// when it fails or runs longer than `limit` (then it is killed: a hung program must fail the
/// suite, not hang it).
fn build_and_run_with(source: &str, cpp: bool, link: bool, args: &[&str], limit: Duration, memcheck: bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = lib_dir();
    let out = std::env::temp_dir().join(format!("tokenrace-{}-{}", std::process::id(), source.replace('.', "_")));
    let mut cmd = compiler(cpp).to_command();
    cmd.arg(root.join("c_tests").join(source)).arg("-I").arg(root.join("include")).arg("-o").arg(&out);
    cmd.args(["-Wall", "-Wextra", "-Werror", "-pthread"]);
    if cpp {
        cmd.arg("-std=c++17");
    } else {
        cmd.arg("-std=c11");
    }
    if link {
        cmd.arg("-L").arg(&lib).arg("-ltokenrace").arg(format!("-Wl,-rpath,{}", lib.display()));
    }
    cmd.args(["-lm", "-ldl"]);
    let status = cmd.status().expect("the C compiler runs");
    assert!(status.success(), "compiling {source} failed");
    // The output goes to files rather than pipes, so that waiting with a limit cannot block on a
    // full pipe.
    let (stdout_path, stderr_path) = (out.with_extension("stdout"), out.with_extension("stderr"));
    let mut child = run_command(&out, memcheck)
        .args(args)
        .stdout(std::fs::File::create(&stdout_path).unwrap())
        .stderr(std::fs::File::create(&stderr_path).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > limit {
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
    let status = status.unwrap_or_else(|| panic!("{source} ran longer than {limit:?} and was killed:\n{output}"));
    assert!(status.success(), "{source} failed ({status}):\n{output}");
}

/// As [`build_and_run_with`], under memcheck when it is requested.
fn build_and_run(source: &str, cpp: bool, link: bool, args: &[&str], limit: Duration) {
    build_and_run_with(source, cpp, link, args, limit, memcheck_requested());
}

/// The limit of a program that should take a second or two (also under memcheck).
const QUICK: Duration = Duration::from_secs(120);

#[test]
fn c_caller_sees_statuses_messages_and_results() {
    build_and_run("test_basic.c", false, true, &[], QUICK);
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
    build_and_run_with("test_fork.c", false, true, &[], Duration::from_secs(240), false);
}
