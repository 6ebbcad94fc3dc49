//! The pipeline's tests: the queue under contention, the helper thread, dropped calls.

use super::*;
use crate::registrar::Registrar;

fn empty_queue() -> QueueLine {
    QueueLine::new(Queue {
        current: Vec::new(),
        backlog_max: 1,
        helper: Helper::Inline,
        record_fresh: false,
        rest: Box::new(QueueRest {
            handed: Vec::new(),
            spare: Vec::new(),
            fresh: FreshRecord::default(),
        }),
    })
}

#[test]
fn the_queue_lock_excludes_and_gives_up_after_its_wait() {
    let q = std::sync::Arc::new(empty_queue());
    let held = q.try_lock_for(Duration::ZERO).unwrap();
    let t0 = std::time::Instant::now();
    assert!(q.try_lock_for(Duration::from_millis(50)).is_none(), "a held lock is not taken twice");
    assert!(t0.elapsed() >= Duration::from_millis(50));
    drop(held);
    // four threads push through the lock at once: nothing lost, nothing doubled
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            let q = q.clone();
            std::thread::spawn(move || {
                for i in 0..20_000 {
                    q.try_lock_for(Duration::from_secs(5)).unwrap().current.push(
                        Work::UserAllocation {
                            api: "t",
                            ptr: k << 32 | i,
                            len: 1,
                            ctx: crate::vamap::ContextTag::Unknown,
                        },
                    );
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let g = q.try_lock_for(Duration::ZERO).unwrap();
    let mut seen: Vec<u64> = g
        .current
        .iter()
        .map(|w| if let Work::UserAllocation { ptr, .. } = w { *ptr } else { u64::MAX })
        .collect();
    seen.sort_unstable();
    seen.dedup();
    assert_eq!(seen.len(), 80_000);
}

/// A pipeline as register mode builds it (no helper thread), for the release check.
fn registering_pipeline(record_fresh: bool) -> &'static Pipeline {
    let table =
        crate::abi::table_for(crate::abi::DriverVersion(580, 0, 0)).expect("a known branch");
    let core = Core {
        decoded: 0,
        tracker: Box::new(crate::tracker::Tracker::new()),
        registrar: Box::new(Registrar::undecided(false)),
        rm: crate::rm::RealRm::new(table, None),
    };
    Box::leak(Box::new(Pipeline::new(core, BACKLOG, false, false, record_fresh)))
}

#[test]
fn a_release_of_what_is_new_since_the_last_core_needs_no_decision() {
    use decode::{Event, Pending};
    let p = registering_pipeline(true);
    let memory = Event::Memory {
        h_client: 1,
        h_parent: 2,
        h_memory: 0x10,
        class: 0x40,
        size: Some(1 << 21),
        attr: 0,
        attr2: 0,
        flags: 0,
    };
    assert!(p.push(Work::Event(memory.clone())).is_ok());
    assert!(p
        .push(Work::Event(Event::UvmCreateExternalRange { base: 0x20_0000, length: 0x20_0000 }))
        .is_ok());
    let decided = |call: Pending| {
        p.lend_for_release(Duration::from_secs(1), |_| true, || Some(call), &mut |_| {})
            .map(|(_, c)| c)
    };
    let new_memory = Pending::RmFree { h_client: 1, h_object: 0x10 };
    let new_range = Pending::UvmFree { base: 0x20_0000 };
    assert_eq!(decided(new_memory), None);
    assert_eq!(decided(new_range), None);
    assert_eq!(
        decided(Pending::UvmMap {
            base: 0x30_0000,
            length: 0x1000,
            offset: 0,
            h_client: 1,
            h_memory: 0x10
        }),
        None
    );
    let old = Pending::RmFree { h_client: 1, h_object: 0x11 };
    assert_eq!(decided(old), Some(old), "not created since: decided");
    // nothing registered, or nothing to read: nothing to decide
    assert!(p
        .lend_for_release(Duration::from_secs(1), |_| false, || Some(old), &mut |_| {})
        .is_none());
    assert!(p.lend_for_release(Duration::from_secs(1), |_| true, || None, &mut |_| {}).is_none());
    // applying the queue (the summary, a full batch) keeps the record; the way to a
    // registration forgets it
    drop(p.lend(Duration::from_secs(1), &mut |_| {}));
    assert_eq!(decided(new_memory), None, "lend keeps the record");
    drop(p.core(Duration::from_secs(1)));
    assert_eq!(decided(new_memory), Some(new_memory), "a registration may now use it");
    assert_eq!(decided(new_range), Some(new_range));
    // outside register mode nothing is recorded
    let q = registering_pipeline(false);
    assert!(q.push(Work::Event(memory)).is_ok());
    assert!(q
        .lend_for_release(Duration::from_secs(1), |_| true, || Some(new_memory), &mut |_| {})
        .is_some());
}

/// A dropped call marks the map incomplete; even a release of something new is decided.
#[test]
fn a_dropped_call_marks_the_map_incomplete() {
    let p = registering_pipeline(true);
    let range = decode::Event::UvmCreateExternalRange { base: 0x20_0000, length: 0x20_0000 };
    assert!(p.push(Work::Event(range.clone())).is_ok());
    std::thread::scope(|s| {
        let held = p.queue.try_lock_for(Duration::ZERO).unwrap();
        let pusher = s.spawn(|| {
            p.push(Work::Event(decode::Event::UvmFree { base: 0x20_0000, length: None })).is_err()
        });
        assert!(pusher.join().unwrap(), "not pushed while the lock was held");
        drop(held);
    });
    let free = decode::Pending::UvmFree { base: 0x20_0000 };
    assert!(
        p.lend_for_release(Duration::from_secs(1), |_| true, || Some(free), &mut |_| {}).is_some(),
        "decided"
    );
    assert!(p.core(Duration::from_secs(1)).unwrap().tracker.incomplete);
}
