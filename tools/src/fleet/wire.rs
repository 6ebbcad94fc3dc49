//! The rendezvous: TCP to the address the launcher gives, rank 0 serving it from a thread of its
//! own. Every exchange is one all-gather: each task sends one message, and once all have, each
//! gets every task's message in rank order. A barrier is an all-gather of nothing; what rank 0
//! decides reaches the others as its part of one. Every wait is bounded: a task that does not
//! come, or goes away, ends the run on every task with its rank named, never a hang.
//!
//! Frames: a u32 length (little-endian), then the bytes; the first byte says what it is:
//! `H` hello (`rank\tsize\tjob\tprotocol`), `D` a task's part, `A` all parts (each a u32 length
//! and its bytes), `B` a task is done, `X` the run is over (why).

use super::launch::Rendezvous;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const PROTOCOL: &str = "gdrshim-fleet-2";
const MAX_FRAME: usize = 64 << 20;

fn write_frame(s: &mut TcpStream, kind: u8, body: &[u8]) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(body.len() + 5);
    buf.extend_from_slice(&((body.len() + 1) as u32).to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(body);
    s.write_all(&buf)
}

/// One frame, waiting at most until `until`.
fn read_frame(s: &mut TcpStream, until: Instant) -> std::io::Result<(u8, Vec<u8>)> {
    let left = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))?;
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len == 0 || len > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes"),
        ));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    let kind = body.remove(0);
    Ok((kind, body))
}

fn why(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => "no answer in time".into(),
        std::io::ErrorKind::UnexpectedEof => "its connection closed (the task ended)".into(),
        _ => e.to_string(),
    }
}

pub struct Group {
    conn: TcpStream,
    step: Duration,
    server: Option<JoinHandle<Result<(), String>>>,
}

impl Group {
    /// Joins the run: rank 0 starts serving first. `join`: how long the tasks may take to come;
    /// `step`: how long one exchange may take once all are there.
    pub fn join(
        rdv: &Rendezvous,
        rank: usize,
        size: usize,
        job: &str,
        join: Duration,
        step: Duration,
    ) -> Result<Group, String> {
        let server = if rank == 0 {
            let any = if rdv.host.contains(':') { "::" } else { "0.0.0.0" };
            let l = TcpListener::bind((any, rdv.port)).map_err(|e| {
                format!(
                    "rank 0 cannot serve the rendezvous on port {} ({}): {e}",
                    rdv.port, rdv.how
                )
            })?;
            let job = job.to_string();
            Some(std::thread::spawn(move || serve(l, size, &job, join, step)))
        } else {
            None
        };
        let until = Instant::now() + join;
        let conn = loop {
            let addrs: Vec<_> = (rdv.host.as_str(), rdv.port)
                .to_socket_addrs()
                .map(|a| a.collect())
                .unwrap_or_default();
            if let Some(c) = addrs
                .iter()
                .find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(2)).ok())
            {
                break c;
            }
            if Instant::now() >= until {
                return Err(format!(
                    "no rendezvous at {}:{} ({}) within {} s: is rank 0 running there, and is the port open?",
                    rdv.host,
                    rdv.port,
                    rdv.how,
                    join.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let _ = conn.set_nodelay(true);
        let mut g = Group { conn, step: join.max(step), server };
        let hello = format!("{rank}\t{size}\t{job}\t{PROTOCOL}");
        write_frame(&mut g.conn, b'H', hello.as_bytes()).map_err(|e| format!("rendezvous: {e}"))?;
        // the first exchange waits for every task to come
        if let Err(e) = g.all_gather("") {
            // rank 0: its server has told the others; it ends before this task does
            if let Some(h) = g.server.take() {
                let _ = h.join();
            }
            return Err(e);
        }
        g.step = step;
        Ok(g)
    }

    /// Every task's `mine`, in rank order.
    pub fn all_gather(&mut self, mine: &str) -> Result<Vec<String>, String> {
        write_frame(&mut self.conn, b'D', mine.as_bytes())
            .map_err(|e| format!("rendezvous: cannot send: {}", why(&e)))?;
        // longer than rank 0 waits, so that its word on who is missing arrives first
        let (kind, body) =
            read_frame(&mut self.conn, Instant::now() + self.step + Duration::from_secs(5))
                .map_err(|e| format!("rendezvous: rank 0 did not answer: {}", why(&e)))?;
        match kind {
            b'A' => split(&body).ok_or_else(|| "rendezvous: a garbled answer".to_string()),
            b'X' => Err(String::from_utf8_lossy(&body).into_owned()),
            k => Err(format!("rendezvous: an answer of kind {k}")),
        }
    }

    /// Leaves the run; rank 0 also waits for its server to end and reports what it saw.
    pub fn finish(mut self) -> Result<(), String> {
        let _ = write_frame(&mut self.conn, b'B', b"");
        drop(self.conn);
        match self.server {
            Some(h) => h.join().map_err(|_| "the rendezvous server panicked".to_string())?,
            None => Ok(()),
        }
    }
}

fn split(body: &[u8]) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let len = u32::from_le_bytes(body.get(at..at + 4)?.try_into().ok()?) as usize;
        out.push(String::from_utf8_lossy(body.get(at + 4..at + 4 + len)?).into_owned());
        at += 4 + len;
    }
    Some(out)
}

/// Ends the run on every connected task with `msg`; returns it as the server's error.
fn abort<T>(conns: &mut [Option<TcpStream>], msg: String) -> Result<T, String> {
    for c in conns.iter_mut().flatten() {
        let _ = write_frame(c, b'X', msg.as_bytes());
        // what the task sent and nobody read would make the close a reset, which can overtake the word
        let _ = c.set_nonblocking(true);
        let mut sink = [0u8; 4096];
        while matches!(c.read(&mut sink), Ok(n) if n > 0) {}
        let _ = c.shutdown(std::net::Shutdown::Write);
    }
    Err(msg)
}

/// Rank 0's server: `size` hellos within `join`, then all-gathers until the tasks leave.
fn serve(
    l: TcpListener,
    size: usize,
    job: &str,
    join: Duration,
    step: Duration,
) -> Result<(), String> {
    let mut conns = hellos(l, size, job, join)?;
    let mut wait = join;
    loop {
        if all_gather(&mut conns, Instant::now() + wait, step)? {
            return Ok(());
        }
        wait = step;
    }
}

/// Each rank's connection, from its hello, all `size` within `join`.
fn hellos(
    l: TcpListener,
    size: usize,
    job: &str,
    join: Duration,
) -> Result<Vec<Option<TcpStream>>, String> {
    let until = Instant::now() + join;
    let mut conns: Vec<Option<TcpStream>> = (0..size).map(|_| None).collect();
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut have = 0;
    while have < size {
        let (mut c, peer) = match l.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= until {
                    let missing: Vec<String> =
                        (0..size).filter(|&r| conns[r].is_none()).map(|r| r.to_string()).collect();
                    let msg = format!(
                        "rendezvous: rank(s) {} did not come within {} s",
                        missing.join(", "),
                        join.as_secs()
                    );
                    return abort(&mut conns, msg);
                }
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            Err(e) => return abort(&mut conns, format!("rendezvous: accept: {e}")),
        };
        let _ = c.set_nonblocking(false);
        let _ = c.set_nodelay(true);
        match hello(&mut c, peer, size, job, &conns) {
            Ok(Some(r)) => {
                conns[r] = Some(c);
                have += 1;
            }
            Ok(None) => {} // not one of ours, or another run's: ignored
            Err(msg) => return abort(&mut conns, msg),
        }
    }
    Ok(conns)
}

/// A hello read from `c`: the rank it joins as; None for a connection that is not one of this
/// run's tasks (told so); an error that ends the rendezvous (a wrong job size, a rank twice).
fn hello(
    c: &mut TcpStream,
    peer: std::net::SocketAddr,
    size: usize,
    job: &str,
    conns: &[Option<TcpStream>],
) -> Result<Option<usize>, String> {
    let hello = match read_frame(c, Instant::now() + Duration::from_secs(10)) {
        Ok((b'H', b)) => String::from_utf8_lossy(&b).into_owned(),
        _ => return Ok(None), // not one of ours: ignored
    };
    let f: Vec<&str> = hello.split('\t').collect();
    let (r, s) = match (
        f.first().and_then(|x| x.parse::<usize>().ok()),
        f.get(1).and_then(|x| x.parse::<usize>().ok()),
    ) {
        (Some(r), Some(s)) if f.len() == 4 => (r, s),
        _ => return Ok(None),
    };
    if f[3] != PROTOCOL || f[2] != job {
        let _ = write_frame(
            c,
            b'X',
            format!("rendezvous: {peer} is another run ({} {}), not this one", f[2], f[3])
                .as_bytes(),
        );
        return Ok(None);
    }
    let wrong = if s != size || r >= size {
        Some(format!(
            "rendezvous: rank {r} from {peer} says the job has {s} tasks, rank 0 says {size}"
        ))
    } else if conns[r].is_some() {
        Some(format!("rendezvous: two tasks say they are rank {r} (the second from {peer})"))
    } else {
        None
    };
    if let Some(msg) = wrong {
        let _ = write_frame(c, b'X', msg.as_bytes());
        return Err(msg);
    }
    Ok(Some(r))
}

/// One all-gather: every rank's part, then all of them to every rank; true when every task said
/// it is done instead.
fn all_gather(
    conns: &mut [Option<TcpStream>],
    until: Instant,
    step: Duration,
) -> Result<bool, String> {
    let size = conns.len();
    let mut parts: Vec<Option<Vec<u8>>> = (0..size).map(|_| None).collect();
    let mut byes = 0;
    while parts.iter().any(Option::is_none) {
        let r = match ready(conns, &parts, until) {
            Ok(Some(r)) => r,
            Ok(None) => {
                let late: Vec<String> =
                    (0..size).filter(|&r| parts[r].is_none()).map(|r| r.to_string()).collect();
                let msg = format!(
                    "rendezvous: rank(s) {} sent nothing within {} s",
                    late.join(", "),
                    step.as_secs()
                );
                return abort(conns, msg);
            }
            Err(e) => return abort(conns, format!("rendezvous: poll: {e}")),
        };
        let c = conns[r].as_mut().expect("every rank joined");
        match read_frame(c, Instant::now() + Duration::from_secs(10)) {
            Ok((b'D', b)) => parts[r] = Some(b),
            // a task that is done: every task says so after the last exchange
            Ok((b'B', _)) => {
                byes += 1;
                parts[r] = Some(Vec::new());
                conns[r] = None;
            }
            Err(e) => {
                conns[r] = None;
                return abort(conns, format!("rendezvous: rank {r} is gone: {}", why(&e)));
            }
            Ok((k, _)) => {
                return abort(conns, format!("rendezvous: rank {r} sent a frame of kind {k}"))
            }
        }
    }
    if byes == size {
        return Ok(true);
    }
    if byes > 0 {
        return abort(conns, "rendezvous: some tasks finished while others went on".into());
    }
    let mut all = Vec::new();
    for p in parts.into_iter().flatten() {
        all.extend_from_slice(&(p.len() as u32).to_le_bytes());
        all.extend_from_slice(&p);
    }
    for c in conns.iter_mut().flatten() {
        let _ = write_frame(c, b'A', &all);
    }
    Ok(false)
}

/// A rank whose connection has something to read (a frame or its end), among those that have
/// not sent this step's part; None when `until` passes first.
fn ready(
    conns: &[Option<TcpStream>],
    parts: &[Option<Vec<u8>>],
    until: Instant,
) -> std::io::Result<Option<usize>> {
    use std::os::fd::AsRawFd;
    let waiting: Vec<usize> =
        (0..conns.len()).filter(|&r| parts[r].is_none() && conns[r].is_some()).collect();
    let mut fds: Vec<libc::pollfd> = waiting
        .iter()
        .map(|&r| libc::pollfd {
            fd: conns[r].as_ref().map_or(-1, |c| c.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let ms = left.as_millis().min(1000) as libc::c_int;
        // SAFETY: `fds` is a live array of fds.len() pollfd structs; poll only writes revents.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if let Some(k) = fds.iter().position(|p| p.revents != 0) {
            return Ok(Some(waiting[k]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port of its own per test, free now: the kernel's pick (counting on from a base collided
    /// with other programs' listeners on a busy machine).
    fn port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    fn rdv(port: u16) -> Rendezvous {
        Rendezvous { host: "127.0.0.1".into(), port, how: "test".into() }
    }

    /// `size` tasks, each a thread running `body(rank, group)` after joining.
    fn run<T: Send + 'static>(
        size: usize,
        job: impl Fn(usize) -> String,
        body: impl Fn(usize, &mut Group) -> T + Send + Sync + 'static,
    ) -> Vec<Result<T, String>> {
        let p = port();
        let body = std::sync::Arc::new(body);
        let hs: Vec<_> = (0..size)
            .map(|r| {
                let (body, job) = (body.clone(), job(r));
                std::thread::spawn(move || {
                    // the others start before rank 0 does: they wait for it
                    if r == 0 {
                        std::thread::sleep(Duration::from_millis(150));
                    }
                    let mut g = Group::join(
                        &rdv(p),
                        r,
                        size,
                        &job,
                        Duration::from_secs(5),
                        Duration::from_secs(2),
                    )?;
                    let out = body(r, &mut g);
                    g.finish()?;
                    Ok(out)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn all_gathers_give_every_part_in_rank_order() {
        for size in [1, 2, 5, 8] {
            let res = run(
                size,
                |_| "job".into(),
                |r, g| {
                    let mut seen = Vec::new();
                    for step in 0..4 {
                        let mine = if step % 2 == 0 {
                            format!("rank {r} step {step}\nwith\ttabs")
                        } else {
                            String::new()
                        };
                        seen.push(g.all_gather(&mine).unwrap());
                    }
                    seen
                },
            );
            for (r, got) in res.into_iter().enumerate() {
                let got = got.unwrap();
                for (step, parts) in got.iter().enumerate() {
                    let want: Vec<String> = (0..size)
                        .map(|k| {
                            if step % 2 == 0 {
                                format!("rank {k} step {step}\nwith\ttabs")
                            } else {
                                String::new()
                            }
                        })
                        .collect();
                    assert_eq!(parts, &want, "size {size} rank {r} step {step}");
                }
            }
        }
    }

    #[test]
    fn a_task_that_goes_away_ends_the_run_everywhere_naming_it() {
        let t0 = Instant::now();
        let res = run(
            4,
            |_| "job".into(),
            |r, g| {
                g.all_gather("one").unwrap();
                if r == 2 {
                    // dies without saying goodbye: its connection closes
                    let _ = g.conn.shutdown(std::net::Shutdown::Both);
                    return Err("died".to_string());
                }
                g.all_gather("two")
            },
        );
        for (r, x) in res.iter().enumerate() {
            if r == 2 {
                continue;
            }
            let e = match x {
                Ok(Err(e)) => e.clone(),
                Err(e) => e.clone(),
                Ok(Ok(v)) => panic!("rank {r} went on: {v:?}"),
            };
            assert!(e.contains("rank 2 is gone"), "rank {r}: {e}");
        }
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    }

    #[test]
    fn a_task_that_never_comes_and_a_foreign_run_are_bounded() {
        let p = port();
        let t0 = Instant::now();
        let h = std::thread::spawn(move || {
            Group::join(&rdv(p), 0, 3, "job", Duration::from_millis(800), Duration::from_secs(1))
                .err()
        });
        std::thread::sleep(Duration::from_millis(100));
        // another job's task is turned away; rank 1 comes, rank 2 never does
        let foreign =
            Group::join(&rdv(p), 1, 3, "other", Duration::from_millis(600), Duration::from_secs(1))
                .err()
                .unwrap();
        assert!(foreign.contains(&format!("is another run (other {PROTOCOL})")), "{foreign}");
        let one =
            Group::join(&rdv(p), 1, 3, "job", Duration::from_millis(700), Duration::from_secs(1))
                .err()
                .unwrap();
        let zero = h.join().unwrap().unwrap();
        assert!(
            zero.contains("rank(s) 2 did not come within 0 s")
                || zero.contains("rank(s) 2 sent nothing"),
            "{zero}"
        );
        assert!(one.contains("rank(s) 2"), "{one}");
        assert!(t0.elapsed() < Duration::from_secs(3));
        // no rank 0 at all: the client gives up in time, naming where it looked
        let e = Group::join(
            &rdv(port()),
            1,
            2,
            "job",
            Duration::from_millis(300),
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert!(e.contains("no rendezvous at 127.0.0.1:") && e.contains("(test)"), "{e}");
    }

    #[test]
    fn a_size_that_disagrees_is_refused_on_both_ends() {
        let res = run(3, |_| "job".into(), |_, _| ());
        assert!(res.iter().all(|r| r.is_ok()));
        let p = port();
        let h = std::thread::spawn(move || {
            Group::join(&rdv(p), 0, 2, "job", Duration::from_secs(2), Duration::from_secs(1)).err()
        });
        std::thread::sleep(Duration::from_millis(100));
        let e = Group::join(&rdv(p), 1, 3, "job", Duration::from_secs(2), Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(
            e.contains("rank 1 from 127.0.0.1:")
                && e.contains("says the job has 3 tasks, rank 0 says 2"),
            "{e}"
        );
        assert!(h.join().unwrap().is_some());
    }
}
