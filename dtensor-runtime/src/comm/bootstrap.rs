//! torchrun-style rendezvous: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`, and a tiny
//! TCP exchange that ships a fixed-size blob (the 128-byte NCCL unique id) from rank 0 to
//! every other rank. Needs no MPI and no GPU; the NCCL backend uses it in
//! [`NcclComm::from_env`](crate::comm) (feature `cuda`).

use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// Where this process sits in a torchrun-style job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// `RANK`.
    pub rank: usize,
    /// `WORLD_SIZE`.
    pub world_size: usize,
    /// `MASTER_ADDR` and `MASTER_PORT` (required when `world_size > 1`).
    pub master: Option<(String, u16)>,
}

fn bad(reason: String) -> Error {
    Error::InvalidArgument { context: "rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)".into(), reason }
}

impl Rendezvous {
    /// Reads the four variables from the process environment (a value that is not UTF-8 is
    /// an error naming the variable).
    pub fn from_env() -> Result<Rendezvous> {
        for k in ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"] {
            crate::env::var(k)?;
        }
        Self::from_lookup(|k| crate::env::var(k).ok().flatten())
    }

    /// Reads the four variables through `get` (testable without touching the environment).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Rendezvous> {
        let num = |k: &str| -> Result<usize> {
            let v = get(k).ok_or_else(|| bad(format!("environment variable {k} is not set")))?;
            v.trim().parse().map_err(|_| bad(format!("{k}={v} is not a non-negative integer")))
        };
        let rank = num("RANK")?;
        let world_size = num("WORLD_SIZE")?;
        if world_size == 0 {
            return Err(bad("WORLD_SIZE=0".into()));
        }
        if rank >= world_size {
            return Err(Error::RankOutOfRange { rank, world_size });
        }
        let master = if world_size > 1 {
            let addr = get("MASTER_ADDR").ok_or_else(|| bad("environment variable MASTER_ADDR is not set".into()))?;
            let port = num("MASTER_PORT")?;
            let port = u16::try_from(port).map_err(|_| bad(format!("MASTER_PORT={port} is not a TCP port")))?;
            Some((addr, port))
        } else {
            None
        };
        Ok(Rendezvous { rank, world_size, master })
    }

    /// Rank 0 runs `make` and sends its bytes to every other rank over TCP (listening on
    /// `MASTER_PORT`); the others connect to `MASTER_ADDR:MASTER_PORT`, retrying until
    /// `timeout`, and return what rank 0 made.
    pub fn share_from_rank0<const N: usize>(
        &self,
        timeout: Duration,
        make: impl FnOnce() -> Result<[u8; N]>,
    ) -> Result<[u8; N]> {
        let Some((addr, port)) = &self.master else {
            return make(); // a world of one
        };
        let io = |what: String, e: std::io::Error| Error::Backend {
            backend: "bootstrap".into(),
            message: format!("rank {}: {what}: {e}", self.rank),
        };
        // A timeout too long to add to now (Duration::MAX) means no limit.
        let deadline = super::timeout::deadline(timeout);
        if self.rank == 0 {
            let blob = make()?;
            let listener = TcpListener::bind(("0.0.0.0", *port)).map_err(|e| io(format!("bind port {port}"), e))?;
            listener.set_nonblocking(true).map_err(|e| io("set_nonblocking".into(), e))?;
            let mut served = 0;
            while served < self.world_size - 1 {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).map_err(|e| io("set_blocking".into(), e))?;
                        s.write_all(&blob).map_err(|e| io("send".into(), e))?;
                        served += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && !super::timeout::passed(deadline) => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) => return Err(io(format!("only {served} of {} peers connected", self.world_size - 1), e)),
                }
            }
            Ok(blob)
        } else {
            loop {
                match TcpStream::connect((addr.as_str(), *port)) {
                    Ok(mut s) => {
                        s.set_read_timeout(Some(timeout)).map_err(|e| io("set_read_timeout".into(), e))?;
                        let mut blob = [0u8; N];
                        s.read_exact(&mut blob).map_err(|e| io(format!("receive from {addr}:{port}"), e))?;
                        return Ok(blob);
                    }
                    Err(_) if !super::timeout::passed(deadline) => std::thread::sleep(Duration::from_millis(50)),
                    Err(e) => return Err(io(format!("connect to {addr}:{port}"), e)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn parses_and_rejects_bad_variables() {
        let ok = Rendezvous::from_lookup(lookup(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(ok, Rendezvous { rank: 2, world_size: 4, master: Some(("10.0.0.1".into(), 29500)) });
        let single = Rendezvous::from_lookup(lookup(&[("RANK", "0"), ("WORLD_SIZE", "1")])).unwrap();
        assert_eq!(single.master, None);
        for bad_env in [
            &[("WORLD_SIZE", "4")][..],
            &[("RANK", "x"), ("WORLD_SIZE", "4")],
            &[("RANK", "0"), ("WORLD_SIZE", "2")],
            &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "70000")],
            &[("RANK", "0"), ("WORLD_SIZE", "0")],
        ] {
            let e = Rendezvous::from_lookup(lookup(bad_env)).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument { .. }), "{bad_env:?}: {e:?}");
        }
        let e = Rendezvous::from_lookup(lookup(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert!(matches!(e, Error::RankOutOfRange { rank: 4, world_size: 4 }), "{e:?}");
    }

    #[test]
    fn rank0_blob_reaches_every_rank_over_tcp() {
        // A free port: bind to 0, read it, release it (the race with other processes is benign).
        let port = TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port();
        let world = 4;
        let blob: [u8; 128] = std::array::from_fn(|i| (i * 7 + 3) as u8);
        let got: Vec<[u8; 128]> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..world)
                .map(|rank| {
                    s.spawn(move || {
                        let r = Rendezvous { rank, world_size: world, master: Some(("127.0.0.1".into(), port)) };
                        // Only rank 0's `make` may run; the others must receive its bytes.
                        r.share_from_rank0(Duration::from_secs(20), || {
                            assert_eq!(rank, 0, "make ran on rank {rank}");
                            Ok(blob)
                        })
                        .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(got.iter().all(|b| *b == blob));
    }

    #[test]
    fn a_missing_rank0_times_out_with_an_error() {
        let port = TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port();
        let r = Rendezvous { rank: 1, world_size: 2, master: Some(("127.0.0.1".into(), port)) };
        let e = r.share_from_rank0::<4>(Duration::from_millis(300), || Ok([0; 4])).unwrap_err();
        assert!(matches!(e, Error::Backend { .. }), "{e:?}");
    }
}
