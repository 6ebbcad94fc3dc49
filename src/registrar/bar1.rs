//! BAR1 as a budget: without static BAR1 every dma-buf of ours takes BAR1 space for
//! as long as it lives (RM maps a buffer's pieces once for all its importers), and a GPU whose
//! BAR1 is small (some 3090 VBIOSes: 256 MiB) runs out long before its memory does. What RM says
//! of each GPU's BAR1 is asked once, at the GPU's first export of ours (a process that never
//! exports asks nothing), and one warning per GPU says when our live buffers and the next one
//! would not fit. The registration goes ahead all the same: RM decides, we only warn.
#![forbid(unsafe_code)]

use rustc_hash::FxHashMap as HashMap;

/// What is known of one GPU's BAR1; `None`: could not be told (never guessed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bar1 {
    /// The BAR1 aperture in bytes (RM's BAR1_SIZE, else the PCI device's BAR 1 length).
    pub bytes: Option<u64>,
    /// All of video memory mapped once (static BAR1): exports cost no BAR1 of their own.
    pub is_static: Option<bool>,
    /// Where `bytes` came from, for the log line: "RM" or "sysfs".
    pub source: &'static str,
}

#[derive(Default)]
struct Gpu {
    bar1: Bar1,
    /// Bytes of our buffers alive on this GPU.
    exported: u64,
    warned: bool,
}

/// Per GPU (RM device instance): its BAR1 and what our live buffers take of it.
#[derive(Default)]
pub struct Budget {
    gpus: HashMap<u32, Gpu>,
}

impl Budget {
    /// Whether this GPU's BAR1 was asked already.
    pub fn known(&self, device_instance: u32) -> bool {
        self.gpus.contains_key(&device_instance)
    }

    /// RM's (or sysfs's) answer for a GPU, kept for the process's life.
    pub fn learn(&mut self, device_instance: u32, bar1: Bar1) {
        self.gpus.entry(device_instance).or_default().bar1 = bar1;
    }

    /// A new buffer of `bytes` on the GPU is about to be used by an MR: the warning to give first,
    /// once per GPU, when our live buffers and this one would not fit in a BAR1 that is not static.
    pub fn before_new_buffer(&mut self, device_instance: u32, bytes: u64) -> Option<String> {
        let g = self.gpus.entry(device_instance).or_default();
        let (Some(size), Some(false)) = (g.bar1.bytes, g.bar1.is_static) else { return None };
        if g.warned || g.exported.saturating_add(bytes) <= size {
            return None;
        }
        g.warned = true;
        Some(format!(
            "GPU (RM device {device_instance}): registrations would exceed its BAR1: BAR1 {} ({}, not static), \
             gdrshim's dma-bufs live {}, this buffer {}. Each buffer takes BAR1 space while MRs use it; \
             when BAR1 runs out RM refuses the export and the registration fails. Likely fixes: enable \
             Resizable BAR in the BIOS (or a VBIOS with a larger BAR1) so that BAR1 covers all memory \
             (static BAR1); fewer, larger registrations (one buffer registered once, not many small ones); \
             register the same buffer on every NIC (gdrshim shares one dma-buf per buffer). \
             The registration goes ahead (RM decides); this is said once per GPU.",
            mib(size),
            g.bar1.source,
            mib(g.exported),
            mib(bytes)
        ))
    }

    pub fn buffer_added(&mut self, device_instance: u32, bytes: u64) {
        let g = self.gpus.entry(device_instance).or_default();
        g.exported = g.exported.saturating_add(bytes);
    }

    pub fn buffer_gone(&mut self, device_instance: u32, bytes: u64) {
        if let Some(g) = self.gpus.get_mut(&device_instance) {
            g.exported = g.exported.saturating_sub(bytes);
        }
    }

    /// For the summary: the smallest BAR1 among the GPUs asked (`None`: none asked, or one
    /// could not be told), and whether all of them are static (`None`: unknown for one of them,
    /// or none asked).
    pub fn summary(&self) -> (Option<u64>, Option<bool>) {
        if self.gpus.is_empty() {
            return (None, None);
        }
        let bytes = self
            .gpus
            .values()
            .map(|g| g.bar1.bytes)
            .collect::<Option<Vec<u64>>>()
            .and_then(|v| v.into_iter().min());
        let all_static = self
            .gpus
            .values()
            .map(|g| g.bar1.is_static)
            .collect::<Option<Vec<bool>>>()
            .map(|v| v.iter().all(|&s| s));
        (bytes, all_static)
    }
}

/// Bytes as a person reads them: MiB, GiB where whole.
pub fn mib(bytes: u64) -> String {
    const MIB: u64 = 1 << 20;
    if bytes >= 1 << 30 && bytes.is_multiple_of(1 << 30) {
        format!("{} GiB", bytes >> 30)
    } else if bytes.is_multiple_of(MIB) {
        format!("{} MiB", bytes / MIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

/// The length of BAR `index` from the text of a PCI device's sysfs `resource` file (one line
/// per BAR: start, end, flags in hex); `None` for an unassigned BAR (all zero) or text that is
/// not that.
pub fn sysfs_bar_len(resource: &str, index: usize) -> Option<u64> {
    let line = resource.lines().nth(index)?;
    let mut it =
        line.split_whitespace().map(|w| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok());
    let (start, end) = (it.next()??, it.next()??);
    (end > start).then(|| end - start + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn small(is_static: bool) -> Bar1 {
        Bar1 { bytes: Some(256 * MIB), is_static: Some(is_static), source: "RM" }
    }

    #[test]
    fn one_warning_per_gpu_when_buffers_would_not_fit_a_non_static_bar1() {
        let mut b = Budget::default();
        b.learn(0, small(false));
        b.learn(1, small(false));
        for _ in 0..4 {
            assert_eq!(b.before_new_buffer(0, 64 * MIB), None, "up to 256 MiB fits");
            b.buffer_added(0, 64 * MIB);
        }
        let w = b.before_new_buffer(0, 64 * MIB).expect("the fifth does not fit");
        assert!(
            w.contains("BAR1 256 MiB (RM, not static)")
                && w.contains("live 256 MiB")
                && w.contains("this buffer 64 MiB"),
            "{w}"
        );
        assert!(w.contains("Resizable BAR") && w.contains("goes ahead"), "{w}");
        b.buffer_added(0, 64 * MIB);
        assert_eq!(b.before_new_buffer(0, 64 * MIB), None, "once per GPU");
        // the other GPU has its own budget and its own warning
        assert_eq!(b.before_new_buffer(1, 128 * MIB), None);
        b.buffer_added(1, 128 * MIB);
        assert!(b.before_new_buffer(1, 129 * MIB).is_some());
        // buffers gone give their space back
        for _ in 0..5 {
            b.buffer_gone(0, 64 * MIB);
        }
        b.buffer_gone(0, 64 * MIB);
        assert_eq!(b.summary(), (Some(256 * MIB), Some(false)));
    }

    #[test]
    fn static_or_unknown_bar1_never_warns() {
        let mut b = Budget::default();
        b.learn(0, small(true));
        b.learn(1, Bar1 { bytes: None, is_static: Some(false), source: "" });
        b.learn(2, Bar1 { bytes: Some(MIB), is_static: None, source: "sysfs" });
        for g in 0..3 {
            b.buffer_added(g, 1 << 40);
            assert_eq!(b.before_new_buffer(g, 1 << 30), None, "GPU {g}");
        }
        assert_eq!(b.summary(), (None, None), "one GPU's size and another's kind are unknown");
        assert_eq!(Budget::default().summary(), (None, None), "nothing asked");
        let mut c = Budget::default();
        c.learn(0, small(true));
        c.learn(1, Bar1 { bytes: Some(128 * MIB), is_static: Some(true), source: "RM" });
        assert_eq!(c.summary(), (Some(128 * MIB), Some(true)));
    }

    #[test]
    fn sysfs_resource_lines() {
        let text = "0x00000000fb000000 0x00000000fbffffff 0x0000000000040200\n\
                    0x000000f800000000 0x000000f80fffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        assert_eq!(sysfs_bar_len(text, 1), Some(256 * MIB));
        assert_eq!(sysfs_bar_len(text, 0), Some(16 * MIB));
        assert_eq!(sysfs_bar_len(text, 2), None, "unassigned");
        assert_eq!(sysfs_bar_len(text, 9), None);
        assert_eq!(sysfs_bar_len("garbage here", 0), None);
        assert_eq!(mib(256 * MIB), "256 MiB");
        assert_eq!(mib(32 << 30), "32 GiB");
        assert_eq!(mib(MIB / 2), "0.5 MiB");
    }
}
