//! How every command answers a usage error: one line on stderr, `NAME: what is wrong (try
//! --help)`, exit 2, nothing on stdout. NAME is the script that ran the tool (the wrappers in
//! scripts/ set `GDRSHIM_TOOL_AS`), else `gdrshim-tool SUBCOMMAND`.

/// Set by scripts/find-tool.sh: the name the user typed (`selftest`, `verify-run`…).
pub const AS_VAR: &str = "GDRSHIM_TOOL_AS";

/// The name a message starts with: the wrapper's, else `gdrshim-tool` and the subcommand.
pub fn name(sub: Option<&str>) -> String {
    match std::env::var(AS_VAR) {
        Ok(n) if !n.is_empty() => n,
        _ => sub.map_or("gdrshim-tool".to_string(), |s| format!("gdrshim-tool {s}")),
    }
}

/// What clap's error says, in one line: its first paragraph without `error: `, the lines joined
/// (a list of missing arguments follows its heading on the next lines).
pub fn one_line(rendered: &str) -> String {
    let first = rendered.split("\n\n").next().unwrap_or("");
    let joined: Vec<&str> = first.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let line = joined.join(" ");
    let line = line.strip_prefix("error: ").unwrap_or(&line);
    line.trim_end_matches('.').to_string()
}

/// The usage-error line.
pub fn line(name: &str, what: &str) -> String {
    format!("{name}: {what} (try --help)")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn clap_errors_in_one_line() {
        assert_eq!(
            one_line("error: unexpected argument '--bogus' found\n\n  tip: to pass '--bogus' as a value, use '-- --bogus'\n\nUsage: x\n"),
            "unexpected argument '--bogus' found"
        );
        assert_eq!(
            one_line("error: the following required arguments were not provided:\n  --nccl-log <FILE>\n\nUsage: x\n\nFor more information, try '--help'.\n"),
            "the following required arguments were not provided: --nccl-log <FILE>"
        );
        assert_eq!(line("selftest", "no"), "selftest: no (try --help)");
    }
}
