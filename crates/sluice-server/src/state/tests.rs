//! Heap allocations per decision through the server's limiter, counted by a global allocator
//! of this test binary (per thread, so tests running beside it do not count).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::future::Future;
use std::sync::Arc;

use sluice::{Limiter, ManualClock, MemoryStore, Reserving, SharedStore};

use super::{ServerClock, Shared, StoreHandle};
use crate::config::Config;

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: a thread being torn down has no counter left, and allocates uncounted.
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// The workspace denies unsafe code; a global allocator cannot be written without it. This one
// only forwards to `System` and counts calls, and it exists only in the unit-test binary.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, that is from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const DECISIONS: u64 = 1_000;
const T0: u64 = 1_700_000_000_000;
const CONFIG: &str = "policies:\n  api:\n    limits:\n      - { max: 1000000, per: 1h }\n";

/// Allocations per decision of `decide`, run [`DECISIONS`] times on this thread after one
/// warm-up (which creates the key's state). Each future is polled in place, once, with a
/// waker that does nothing (a memory store answers at the first poll): a runtime's
/// `block_on` would box a future as large as a Redis call's, and count that box.
fn per_decision<F: Future<Output = ()>>(mut decide: impl FnMut() -> F) -> f64 {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let _in_runtime = rt.enter();
    let mut once = || {
        let decision = std::pin::pin!(decide());
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            decision.poll(&mut cx).is_ready(),
            "a memory store answers at once"
        );
    };
    once();
    let before = ALLOCATIONS.with(Cell::get);
    for _ in 0..DECISIONS {
        once();
    }
    let after = ALLOCATIONS.with(Cell::get);
    (after - before) as f64 / DECISIONS as f64
}

/// The server's limiter (the memory store, `local` as `config` says), and the same policy over
/// the composition the server had before its store handle dispatched by enum: the store behind
/// the library's type-erased [`SharedStore`] (which boxes each call's future), and with
/// `local` the reservation layer over that, erased again.
fn through_the_server_and_erased(config: &str) -> (f64, f64) {
    let config = Config::parse("sluice.yaml", config).unwrap();
    let store = StoreHandle::Memory(Arc::new(MemoryStore::new()));
    let shared = Shared::new(&config, store, None, ServerClock::new(ManualClock::new(T0)));
    let snapshot = shared.snapshot();
    let limiter = &snapshot.limiter;
    let policy = limiter.policy("api").unwrap().clone();
    let server = per_decision(|| async {
        assert!(
            limiter
                .call(&policy, "k", sluice::Op::Check { cost: 1 })
                .await
                .unwrap()
                .allowed
        );
    });
    let memory = SharedStore::new(MemoryStore::new());
    let erased = match config.local {
        Some(local) => SharedStore::new(Reserving::new(memory, local)),
        None => memory,
    };
    let erased = Limiter::new(erased)
        .with_clock(ManualClock::new(T0))
        .with_policy(policy.clone());
    let before = per_decision(|| async {
        assert!(
            erased
                .call(&policy, "k", sluice::Op::Check { cost: 1 })
                .await
                .unwrap()
                .allowed
        );
    });
    (server, before)
}

#[test]
fn a_decision_through_the_store_handle_allocates_no_boxed_future() {
    let (server, erased) = through_the_server_and_erased(CONFIG);
    println!("allocations per decision: server {server}, over SharedStore {erased}");
    assert_eq!(
        server, 0.0,
        "the server's limiter over the memory store allocates"
    );
    assert_eq!(erased, 1.0, "SharedStore boxes each call's future");
}

#[test]
fn with_reservation_a_decision_allocates_no_boxed_future_either() {
    let local = format!("{CONFIG}local:\n  enabled: true\n");
    let (server, erased) = through_the_server_and_erased(&local);
    println!("allocations per decision with local.enabled: server {server}, erased {erased}");
    assert!(
        server + 1.0 <= erased,
        "with reservation the server's limiter allocates {server} times per decision, the \
         type-erased composition {erased}: the handle should save at least the outer box"
    );
}
