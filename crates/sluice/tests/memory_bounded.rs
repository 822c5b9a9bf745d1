//! The memory store gives memory back: after 1,000,000 distinct keys go idle and are swept,
//! the heap returns to its baseline. Measured with a counting global allocator, so this test
//! lives alone in its binary.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests fail loudly by design

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use sluice::{LimitSpec, Limiter, ManualClock, MemoryStore, Policy};

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// The workspace denies unsafe code; a global allocator cannot be written without it. This one
// only forwards to `System` and counts bytes, and it exists only in this test binary.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

#[test]
fn memory_returns_to_baseline_after_a_million_keys_go_idle() {
    const KEYS: u64 = 1_000_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let clock = ManualClock::new(1_700_000_000_000);
    let policy = Policy::from_specs(
        "api",
        vec![
            LimitSpec::fixed_window(10, 1_000),
            LimitSpec::sliding_window(100, 60_000),
            LimitSpec::token_bucket(5, 1_000),
        ],
    )
    .expect("valid policy");
    let limiter = Limiter::new(MemoryStore::new())
        .with_clock(clock.clone())
        .with_policy(policy);
    let mut key = String::with_capacity(32);
    let baseline = live();

    rt.block_on(async {
        for i in 0..KEYS {
            use std::fmt::Write;
            key.clear();
            write!(key, "user:{i}").expect("write to a String");
            let d = limiter.check("api", &key, 1).await.expect("memory store");
            assert!(d.allowed);
        }
    });
    let peak = live();
    assert_eq!(limiter.store().len() as u64, KEYS);
    let per_key = (peak - baseline) / KEYS as isize;
    println!(
        "live heap with {KEYS} keys: {} MiB ({per_key} B/key)",
        (peak - baseline) >> 20
    );
    assert!(per_key > 100, "the keys were not held: {per_key} B/key");

    // Every window is closed and every bucket full a minute later.
    let idle = clock.advance(61_000);
    assert_eq!(limiter.store().sweep(idle), KEYS as usize);
    let after = live();
    println!(
        "live heap after the sweep: {} B above baseline",
        after - baseline
    );
    assert!(limiter.store().is_empty());
    assert!(
        after - baseline < 64 * 1024,
        "{} bytes still held after every key went idle",
        after - baseline
    );
}
