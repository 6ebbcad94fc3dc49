//! What a NCCL Tests exit status says: 0 ran clean, 2 CUDA error, 3 NCCL error, 7 wrong data;
//! 128+N is how a shell reports death by signal N, which no CUDA or NCCL error explains.

use crate::report::{Check, Status};

/// Linux (x86-64, arm64) signal numbers 1..=31.
const SIGNALS: [&str; 31] = [
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];

/// The name of signal `n` (SIGKILL for 9; real-time signals as SIGRTMIN+k).
pub fn signal_name(n: u8) -> String {
    match n {
        1..=31 => SIGNALS[usize::from(n) - 1].to_string(),
        34 => "SIGRTMIN".to_string(),
        35..=64 => format!("SIGRTMIN+{}", n - 34),
        _ => format!("signal {n}"),
    }
}

/// The `nccl.exit` check of a non-zero status other than 7.
pub fn exit_check(c: i32) -> Check {
    let signal = u8::try_from(c).ok().filter(|c| (129..=128 + 64).contains(c)).map(|c| c - 128);
    if let Some(n) = signal {
        let why = match n {
            9 => "the kernel's out-of-memory killer or the job scheduler (time or memory limit, scancel, kill -9)",
            15 => "a job scheduler or an operator stopped it (time limit, scancel, kill)",
            2 => "interrupted (Ctrl-C)",
            6 => "it aborted itself (an assertion, or abort() after a fatal error: see the end of the log)",
            11 | 7 => "it crashed (invalid memory access on the CPU side: see the end of the log and a core dump)",
            _ => "the signal came from outside the run or from a crash",
        };
        return Check::new(
            "nccl.exit",
            Status::Fail,
            format!(
                "exit status {c}: killed by signal {n} ({}), not a CUDA or NCCL error: {why}",
                signal_name(n)
            ),
        )
        .fix("rerun to completion; a process killed by a signal prints no gdrshim summary");
    }
    let what = match c {
        2 => "a CUDA error (see the failure line at the end of the log)",
        3 => "a NCCL error (see the failure line and the NCCL WARN lines of the log)",
        _ => "NCCL Tests failed (2: CUDA error, 3: NCCL error, 7: wrong data; 128+N: killed by signal N)",
    };
    Check::new("nccl.exit", Status::Fail, format!("exit status {c}: {what}"))
}
