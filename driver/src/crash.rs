//! A clear last word when the process crashes.
//!
//! ppcc runs MLIR's and LLVM's passes, users' pass plugins and the code it generated in its
//! own process. A fault there (a segmentation fault in an MLIR pass on IR it mishandles, a
//! plugin's bug, an out-of-bounds access in a generated kernel) used to end ppcc with the
//! shell's bare "Segmentation fault" and no word of what it was doing. [`install`] sets a
//! handler for the fatal signals that writes what ppcc was doing ([`set_step`], the step the
//! progress line shows, or the finer [`StepGuard`] of the current thread), that this is a
//! bug to report, and exits with status 70 (`EX_SOFTWARE`). Bad input is still meant to get
//! an ordinary error long before such a point; this is the net under that.
//!
//! The handler only does what is async-signal-safe: it reads two pointers to
//! NUL-terminated strings (never freed once published, so a racing [`set_step`] cannot pull
//! one from under it), `write(2)`s and `_exit`s. It runs on the alternate signal stack Rust
//! sets up for every thread, so a stack overflow reaches it too.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CString};

use libc::{SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGSEGV};
use std::sync::atomic::{AtomicPtr, Ordering};

/// The exit status after a crash (`EX_SOFTWARE` of `sysexits.h`: an internal software
/// error).
pub const CRASH_EXIT: i32 = 70;

static PROGRAM: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());
static STEP: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    static THREAD_STEP: Cell<*const c_char> = const { Cell::new(std::ptr::null()) };
}

/// A string for the handler to read at any time: published once and never freed (steps are
/// few, a handful per compile).
fn publish(s: &str) -> *mut c_char {
    CString::new(s.replace('\0', " "))
        .unwrap_or_default()
        .into_raw()
}

/// What the process is doing now, for every thread without a [`StepGuard`] of its own:
/// "generating code for stage 1".
pub fn set_step(what: &str) {
    STEP.store(publish(what), Ordering::SeqCst);
}

/// The current thread's own step while the guard lives (restoring the one before).
pub struct StepGuard {
    before: *const c_char,
}

impl StepGuard {
    pub fn new(what: &str) -> StepGuard {
        let p = publish(what);
        let before = THREAD_STEP.with(|s| s.replace(p));
        StepGuard { before }
    }
}

impl Drop for StepGuard {
    fn drop(&mut self) {
        THREAD_STEP.with(|s| s.set(self.before));
    }
}

fn put(s: &[u8]) {
    // SAFETY: writes `s` to standard error; `write` is async-signal-safe.
    unsafe {
        libc::write(2, s.as_ptr() as *const c_void, s.len());
    }
}

fn put_c(p: *const c_char) {
    if p.is_null() {
        return;
    }
    // SAFETY: `p` is a NUL-terminated string published by `publish` and never freed;
    // `CStr::from_ptr` only reads up to its NUL, which is safe in a signal handler.
    put(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes());
}

extern "C" fn on_fatal_signal(signum: c_int, _info: *mut c_void, _context: *mut c_void) {
    let what: &[u8] = match signum {
        SIGSEGV => b"a segmentation fault (or a stack overflow)",
        SIGBUS => b"a bus error",
        SIGILL => b"an illegal instruction",
        SIGFPE => b"an arithmetic fault",
        SIGABRT => b"an abort",
        _ => b"a fatal signal",
    };
    let program = PROGRAM.load(Ordering::SeqCst);
    if program.is_null() {
        put(b"ppcc");
    } else {
        put_c(program);
    }
    put(b": internal error: ");
    put(what);
    // A thread-local with a constant initialiser and no destructor: a plain read.
    let step = THREAD_STEP
        .try_with(|s| s.get())
        .ok()
        .filter(|p| !p.is_null())
        .unwrap_or(STEP.load(Ordering::SeqCst));
    if step.is_null() {
        put(b".\n");
    } else {
        put(b" while ");
        put_c(step);
        put(b".\n");
    }
    put(b"This is a bug in ppcc or in what it ran (MLIR, LLVM, a pass plugin, the generated code), not in the model or the command: please report it with both. What was being written may be incomplete.\n");
    // SAFETY: ends the process at once, as the signal would have.
    unsafe { libc::_exit(CRASH_EXIT) }
}

/// Handle the fatal signals of this process from now on (see the module docs); `program`
/// starts the message ("ppcc", "ppcc-opt"). First thing in `main`.
pub fn install(program: &str) {
    PROGRAM.store(publish(program), Ordering::SeqCst);
    // SAFETY: a zeroed `struct sigaction` is valid (empty mask); the handler only does
    // async-signal-safe work.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_fatal_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut act.sa_mask);
        for sig in [SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT] {
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

/// The default disposition of the fatal signals again (the process dies by the signal): for
/// a worker process whose parent reports how it died, such as `ppcc conform`'s.
pub fn uninstall() {
    for sig in [SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT] {
        // SAFETY: restores the default action of a fatal signal.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST: &str = "crash::tests::a_fault_names_what_was_running_and_exits_70";

    /// The child's part: install the handler, name steps, fault as `mode` says.
    fn child(mode: &str) -> ! {
        install("crash-test");
        set_step("the global step");
        match mode {
            "global" => {}
            "thread" => {
                let _outer = StepGuard::new("an outer step");
                let _inner = StepGuard::new("the thread's step");
                // SAFETY: the fault under test.
                unsafe { libc::raise(SIGSEGV) };
            }
            "overflow" => {
                fn deeper(n: u64) -> u64 {
                    if n == u64::MAX {
                        return 0;
                    }
                    let pad = std::hint::black_box([n; 512]);
                    pad[(n % 512) as usize] + deeper(std::hint::black_box(n + 1))
                }
                let t = std::thread::spawn(|| {
                    let _g = StepGuard::new("recursing in a thread");
                    deeper(0)
                });
                let _ = t.join();
            }
            _ => {}
        }
        // SAFETY: the fault under test.
        unsafe { libc::raise(if mode == "abort" { SIGABRT } else { SIGSEGV }) };
        std::process::exit(1)
    }

    /// This test binary runs itself once per case with `PPCC_CRASH_CHILD` set; the child
    /// faults, and its last word must name the innermost step of the faulting thread (or
    /// the process's step) and end the process with status 70.
    #[test]
    fn a_fault_names_what_was_running_and_exits_70() {
        if let Some(mode) = std::env::var_os("PPCC_CRASH_CHILD") {
            child(&mode.to_string_lossy());
        }
        let cases = [
            (
                "global",
                "a segmentation fault (or a stack overflow) while the global step.",
            ),
            (
                "thread",
                "a segmentation fault (or a stack overflow) while the thread's step.",
            ),
            (
                "overflow",
                "a segmentation fault (or a stack overflow) while recursing in a thread.",
            ),
            ("abort", "an abort while the global step."),
        ];
        let exe = std::env::current_exe().expect("the test binary's path");
        for (mode, want) in cases {
            let out = std::process::Command::new(&exe)
                .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
                .env("PPCC_CRASH_CHILD", mode)
                .output()
                .expect("the test binary runs");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(CRASH_EXIT), "{mode}: {err}");
            assert!(
                err.contains(&format!("crash-test: internal error: {want}\n")),
                "{mode}: {err}"
            );
            assert!(err.contains("please report it"), "{mode}: {err}");
        }
    }
}
