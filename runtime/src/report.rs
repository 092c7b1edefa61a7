//! How a program reports the error that stops it: one line on stderr,
//! `program: what happened: why`, each cause said once. anyhow's own report
//! adds a backtrace whenever `RUST_BACKTRACE` is set, which buries the line
//! an operator needs (a port already taken, a file missing) under a page
//! meant for a developer.

use std::error::Error;
use std::process::ExitCode;

/// An error and its causes on one line, `a: b: c`, leaving out a cause whose
/// words its wrapper already says.
pub fn one_line(error: &(dyn Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut next = error.source();
    while let Some(cause) = next {
        let text = cause.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        next = cause.source();
    }
    line
}

/// The exit of a program's `main`: success, or the error on one line of
/// stderr after the program's name and status 1.
pub fn exit(program: &str, result: Result<(), Box<dyn Error + Send + Sync>>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {}", one_line(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot listen on 127.0.0.1:7117: {0}")]
    struct Listen(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("cannot start")]
    struct Start(#[source] Listen);

    #[test]
    fn each_cause_is_said_once() {
        let taken = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let text = taken.to_string();
        let error = Start(Listen(taken));
        assert_eq!(
            one_line(&error),
            format!("cannot start: cannot listen on 127.0.0.1:7117: {text}")
        );
    }
}
