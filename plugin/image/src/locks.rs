//! [`KeyedLocks`]: one async lock per name, held only by the operations on that name.
//!
//! The image engine serializes what shares state (a target, or a store key and its shared view) and lets
//! everything else run side by side: a slow containerd call for one image never holds up another image's
//! volumes. An entry lives only while somebody holds or waits for it, so the map is as large as the work in
//! flight, never as the number of volumes on the node.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Named async locks.
#[derive(Debug, Default)]
pub struct KeyedLocks {
    entries: Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>,
}

/// Holds the lock on one name; dropping it lets the next waiter in and forgets the entry when none waits.
#[derive(Debug)]
pub struct KeyGuard {
    name: String,
    guard: Option<OwnedMutexGuard<()>>,
    entries: Arc<Mutex<HashMap<String, Arc<AsyncMutex<()>>>>>,
}

impl KeyedLocks {
    /// Waits for the lock on `name`.
    pub async fn lock(&self, name: &str) -> KeyGuard {
        let lock = Arc::clone(self.entries.lock().entry(name.to_string()).or_default());
        let guard = lock.lock_owned().await;
        KeyGuard {
            name: name.to_string(),
            guard: Some(guard),
            entries: Arc::clone(&self.entries),
        }
    }

    /// How many names are held or waited for.
    #[cfg(test)]
    pub fn in_flight(&self) -> usize {
        self.entries.lock().len()
    }
}

impl Drop for KeyGuard {
    fn drop(&mut self) {
        let mut entries = self.entries.lock();
        drop(self.guard.take());
        // The map's reference is the only one left when nobody holds or waits for this name: a waiter
        // clones the Arc under this same map lock before it waits.
        if entries
            .get(&self.name)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
        {
            entries.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_name_is_serialized_and_other_names_are_not() {
        let locks = Arc::new(KeyedLocks::default());
        let a = locks.lock("a").await;
        // Another name is free while "a" is held.
        let b = locks.lock("b").await;
        drop(b);
        let waiter = {
            let locks = Arc::clone(&locks);
            tokio::spawn(async move { drop(locks.lock("a").await) })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a second holder of \"a\" got in");
        drop(a);
        waiter.await.unwrap();
        assert_eq!(locks.in_flight(), 0, "entries outlive their holders");
    }
}
