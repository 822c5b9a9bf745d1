//! Background tasks that end with their owner.

use std::sync::Mutex;

use tokio::task::AbortHandle;

/// A store's background tasks, aborted when it is dropped (each holds only a weak reference
/// to the store, so none keeps it alive).
#[derive(Default)]
pub(crate) struct Tasks(Mutex<Vec<AbortHandle>>);

impl Tasks {
    /// Takes charge of `tasks`, aborting them with the rest.
    pub(crate) fn set(&self, tasks: Vec<AbortHandle>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = tasks;
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in self
            .0
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            task.abort();
        }
    }
}
