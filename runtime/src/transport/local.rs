//! All ranks as threads of one process: a mailbox per rank.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use ppir::{Tensor, TensorType};

use super::{check_type, Tag, Transport, TransportError};

#[derive(Default)]
struct Mailbox {
    messages: HashMap<Tag, Tensor>,
}

struct Shared {
    boxes: Vec<(Mutex<Mailbox>, Condvar)>,
    /// Why the run stopped, once a rank failed.
    abort: Mutex<Option<String>>,
    /// (ranks arrived, generation) of the current barrier.
    barrier: (Mutex<(usize, u64)>, Condvar),
}

/// The network of a single-process run: create it once, then take one endpoint per rank.
#[derive(Clone)]
pub struct LocalNet {
    shared: Arc<Shared>,
}

impl LocalNet {
    pub fn new(ranks: usize) -> Self {
        LocalNet {
            shared: Arc::new(Shared {
                boxes: (0..ranks)
                    .map(|_| (Mutex::new(Mailbox::default()), Condvar::new()))
                    .collect(),
                abort: Mutex::new(None),
                barrier: (Mutex::new((0, 0)), Condvar::new()),
            }),
        }
    }

    /// The endpoint of `rank`.
    pub fn endpoint(&self, rank: usize) -> LocalEndpoint {
        LocalEndpoint {
            rank,
            shared: self.shared.clone(),
        }
    }

    /// The reason of the first abort, if any.
    pub fn aborted(&self) -> Option<String> {
        self.shared.abort.lock().ok().and_then(|g| g.clone())
    }

    /// Stop every rank.
    pub fn abort(&self, reason: &str) {
        abort(&self.shared, reason);
    }

    /// Messages sent but never received (a correct run leaves none).
    pub fn pending(&self) -> usize {
        self.shared
            .boxes
            .iter()
            .map(|(m, _)| m.lock().map(|g| g.messages.len()).unwrap_or(0))
            .sum()
    }
}

fn abort(shared: &Shared, reason: &str) {
    if let Ok(mut a) = shared.abort.lock() {
        if a.is_none() {
            *a = Some(reason.to_string());
        }
    }
    for (_, cv) in &shared.boxes {
        cv.notify_all();
    }
    shared.barrier.1.notify_all();
}

/// One rank's endpoint of a [`LocalNet`].
pub struct LocalEndpoint {
    rank: usize,
    shared: Arc<Shared>,
}

impl Transport for LocalEndpoint {
    fn rank(&self) -> usize {
        self.rank
    }

    fn aborted(&self) -> Option<String> {
        self.shared.abort.lock().ok().and_then(|g| g.clone())
    }

    fn size(&self) -> usize {
        self.shared.boxes.len()
    }

    fn send(&mut self, to_rank: usize, tag: Tag, t: Tensor) -> Result<(), TransportError> {
        let (m, cv) = self
            .shared
            .boxes
            .get(to_rank)
            .ok_or_else(|| TransportError::Failed(format!("no rank {to_rank}")))?;
        let mut g = m
            .lock()
            .map_err(|_| TransportError::Failed("a mailbox is poisoned".into()))?;
        if g.messages.insert(tag, t).is_some() {
            return Err(TransportError::Failed(format!("{tag} was sent twice")));
        }
        cv.notify_all();
        Ok(())
    }

    fn recv(
        &mut self,
        _from_rank: usize,
        tag: Tag,
        ty: &TensorType,
        timeout: Duration,
    ) -> Result<Tensor, TransportError> {
        let start = Instant::now();
        let (m, cv) = &self.shared.boxes[self.rank];
        let mut g = m
            .lock()
            .map_err(|_| TransportError::Failed("a mailbox is poisoned".into()))?;
        loop {
            if let Some(t) = g.messages.remove(&tag) {
                check_type(&tag, &t, ty)?;
                return Ok(t);
            }
            if let Some(reason) = self.aborted() {
                return Err(TransportError::Aborted(reason));
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(TransportError::Timeout { tag, waited });
            }
            let slice = (timeout - waited).min(Duration::from_millis(200));
            g = cv
                .wait_timeout(g, slice)
                .map_err(|_| TransportError::Failed("a mailbox is poisoned".into()))?
                .0;
        }
    }

    fn abort(&mut self, reason: &str) {
        abort(&self.shared, reason);
    }

    fn barrier(&mut self) -> Result<(), TransportError> {
        let n = self.shared.boxes.len();
        let (m, cv) = &self.shared.barrier;
        fn poisoned<T>(_: T) -> TransportError {
            TransportError::Failed("the barrier is poisoned".into())
        }
        let mut g = m.lock().map_err(poisoned)?;
        let generation = g.1;
        g.0 += 1;
        if g.0 == n {
            *g = (0, generation + 1);
            cv.notify_all();
            return Ok(());
        }
        while g.1 == generation {
            if let Some(reason) = self.aborted() {
                return Err(TransportError::Aborted(reason));
            }
            g = cv
                .wait_timeout(g, Duration::from_millis(200))
                .map_err(poisoned)?
                .0;
        }
        Ok(())
    }
}
