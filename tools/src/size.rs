//! Sizes as every command takes them (`--size`): bytes, or a number with a binary suffix, as NCCL
//! Tests (`-b 8 -e 128M`) writes them: K, M or G in either case, 1K = 1024; the IEC names KiB,
//! MiB and GiB say the same and are taken too. KB, MB and GB are refused: in SI they are powers of
//! ten, and a transfer 5% off the one meant is worse than a usage error. No sign, no fraction, no
//! space; 0 is a size (each command's range says whether it may be used).
#![forbid(unsafe_code)]

/// What `--help` says of a size (after the command's own words).
pub const FORMS: &str = "bytes, or with K, M, G: 1K = 1024";

/// The suffixes taken, lower-case, and their multiples.
const SUFFIXES: [(&str, u64); 7] = [
    ("", 1),
    ("k", 1 << 10),
    ("m", 1 << 20),
    ("g", 1 << 30),
    ("kib", 1 << 10),
    ("mib", 1 << 20),
    ("gib", 1 << 30),
];

/// A size in bytes: "65536", "64K", "64k", "64KiB", "16M", "1G".
pub fn parse(v: &str) -> Result<u64, String> {
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    let (number, suffix) = v.split_at(digits);
    let unit = suffix.to_ascii_lowercase();
    let Some(&(_, multiple)) = SUFFIXES.iter().find(|(s, _)| *s == unit) else {
        if number.is_empty() {
            return Err(format!("not a size: {FORMS} (64K, 16M, 1G)"));
        }
        if matches!(unit.as_str(), "kb" | "mb" | "gb") {
            let k = &suffix[..1];
            return Err(format!(
                "{suffix} is a power of ten in SI: write {number}{k} or {number}{k}iB (binary, 1K = 1024)"
            ));
        }
        return Err(format!("{suffix:?} is no size suffix: {FORMS} (64K, 16M, 1G)"));
    };
    if number.is_empty() {
        return Err(format!("not a size: {FORMS} (64K, 16M, 1G)"));
    }
    number
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiple))
        .ok_or_else(|| format!("more bytes than there are: at most {}", u64::MAX))
}

/// A `--size` value parser: a size from `min` to `max` bytes, a power of two where `power_of_two`.
pub fn parser(
    min: u64,
    max: u64,
    power_of_two: bool,
) -> impl Fn(&str) -> Result<usize, String> + Clone + Send + Sync + 'static {
    move |v| {
        let n = parse(v)?;
        if (min..=max).contains(&n) && (!power_of_two || n.is_power_of_two()) {
            return usize::try_from(n)
                .map_err(|_| format!("more than this machine can address ({})", usize::MAX));
        }
        let what = if power_of_two { "a power of two" } else { "a size" };
        Err(format!("{what} from {min} to {max} ({})", human(max)))
    }
}

/// 1 GiB, 16 MiB, 4 KiB, 100 bytes.
pub fn human(b: u64) -> String {
    match b {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_binary_suffixes_in_either_case() {
        for (v, want) in [
            ("0", 0),
            ("0K", 0),
            ("8", 8),
            ("65536", 65536),
            ("64K", 65536),
            ("64k", 65536),
            ("64KiB", 65536),
            ("64kib", 65536),
            ("4M", 4 << 20),
            ("4m", 4 << 20),
            ("4MiB", 4 << 20),
            ("128M", 128 << 20),
            ("1G", 1 << 30),
            ("4g", 4 << 30),
            ("4GiB", 4 << 30),
            ("007", 7),
            ("18446744073709551615", u64::MAX),
            ("17179869183G", 17179869183 << 30),
        ] {
            assert_eq!(parse(v), Ok(want), "{v}");
        }
    }

    #[test]
    fn what_is_no_size_is_refused_with_the_forms_that_are() {
        for v in [
            "", "K", "M", "-1", "+1", " 4M", "4M ", "4 M", "1.5M", "0x10", "4T", "4Mi", "4MiBs",
            "four",
        ] {
            let e = parse(v).expect_err(v);
            assert!(e.contains("K, M, G: 1K = 1024") || e.contains("no size suffix"), "{v}: {e}");
        }
        // the SI names: refused, with the two ways to write what was likely meant
        assert_eq!(
            parse("4MB").unwrap_err(),
            "MB is a power of ten in SI: write 4M or 4MiB (binary, 1K = 1024)"
        );
        assert!(parse("2kb")
            .unwrap_err()
            .starts_with("kb is a power of ten in SI: write 2k or 2kiB"));
        assert!(parse("1GB").is_err());
    }

    #[test]
    fn overflow_is_refused_never_wrapped() {
        for v in [
            "18446744073709551616",
            "17179869184G",
            "18014398509481984K",
            "99999999999999999999999",
        ] {
            assert_eq!(
                parse(v).unwrap_err(),
                format!("more bytes than there are: at most {}", u64::MAX),
                "{v}"
            );
        }
    }

    #[test]
    fn a_commands_range_and_powers_of_two() {
        let selftest = parser(65536, 1 << 30, true);
        assert_eq!(selftest("16M"), Ok(16 << 20));
        assert_eq!(selftest("64K"), Ok(65536));
        assert_eq!(selftest("1G"), Ok(1 << 30));
        for v in ["0", "32K", "2G", "1000000", "96K"] {
            assert_eq!(
                selftest(v).unwrap_err(),
                "a power of two from 65536 to 1073741824 (1 GiB)",
                "{v}"
            );
        }
        let fleet = parser(4096, 1 << 32, true);
        assert_eq!(fleet("4M"), Ok(4 << 20));
        assert_eq!(fleet("4G"), Ok(1 << 32));
        assert_eq!(fleet("8G").unwrap_err(), "a power of two from 4096 to 4294967296 (4 GiB)");
        let any = parser(0, u64::MAX, false);
        assert_eq!(any("0"), Ok(0));
        assert_eq!(any("3M"), Ok(3 << 20));
        assert!(any("3MB").unwrap_err().contains("power of ten"), "the parse error first");
    }

    #[test]
    fn human_sizes() {
        assert_eq!(
            [human(1 << 30), human(16 << 20), human(4096), human(100), human(1536)],
            ["1 GiB", "16 MiB", "4 KiB", "100 bytes", "1536 bytes"]
        );
    }
}
